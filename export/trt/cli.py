"""Build a TensorRT engine from an ONNX export directory and write a TensorRT export directory.

    python -m export.trt --onnx exports/onnx --out exports/trt [--min-shape 1x1] --opt-shape 8x384 \\
        --max-shape 32x512 [--fp16] [--timing-cache FILE] [--workspace-gb N] [--no-verify]

The command line of `export.trt.build` (the precision paths and the profile checks are described there):
flags -> :class:`TrtBuildOptions`, progress on stdout, warnings on stderr. Exit codes: 0 written; 1 TensorRT
could not parse or build the network, or the engine does not verify (nothing written), or writing failed;
2 a user error, or no TensorRT or usable CUDA GPU here (one line saying which and how to get it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from export.trt.build import PROG, BuildFailed, StackUnavailable, TrtBuildOptions, build_trt
from export.trt.profile import Shape, parse_shape
from train.common.cli import Failure, OptionsCommand, Parser, to_stderr

__all__ = ["PROG", "build_parser", "main", "options_from_args", "shape_flag"]


def shape_flag(text: str) -> Shape:
    """'8x384' -> (8, 384); argparse's one-line error for anything else."""
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Build a TensorRT engine from an ONNX export directory.")
    p.add_argument("--onnx", required=True, help="ONNX export directory (python -m export.onnx)")
    p.add_argument("--out", required=True, help="TensorRT export directory to write")
    p.add_argument(
        "--min-shape",
        type=shape_flag,
        help="smallest BATCHxSEQUENCE (default: the smallest the graph accepts, 1x1 or 1xk for the beam head)",
    )
    p.add_argument("--opt-shape", type=shape_flag, default="8x384", help="BATCHxSEQUENCE to tune for")
    p.add_argument("--max-shape", type=shape_flag, default="32x512", help="largest BATCHxSEQUENCE")
    p.add_argument(
        "--fp16", action="store_true", help="fp16 engine (strongly typed; see the module doc for older 10.x)"
    )
    p.add_argument(
        "--tf32", action="store_true", help="allow TF32 matmuls in fp32 layers (faster, ~1e-3 error)"
    )
    p.add_argument("--timing-cache", help="timing cache file: loaded if present, saved after the build")
    p.add_argument(
        "--workspace-gb", type=float, default=4.0, help="builder workspace memory pool limit (GiB)"
    )
    p.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip the engine-vs-onnxruntime check"
    )
    return p


def options_from_args(args: argparse.Namespace) -> TrtBuildOptions:
    """The parsed flags as options (the flags' dests are the options' field names)."""
    cache = Path(args.timing_cache) if args.timing_cache else None
    values = {**vars(args), "onnx": Path(args.onnx), "out": Path(args.out), "timing_cache": cache}
    return TrtBuildOptions(**values)


def build(options: TrtBuildOptions) -> None:
    build_trt(options, report=print, warn=to_stderr)


# Entry point: user errors and a missing GPU stack -> one line and exit 2; a failed build -> exit 1.
main = OptionsCommand(
    PROG,
    build_parser,
    options_from_args,
    build,
    failures=(Failure(StackUnavailable, 2), Failure(BuildFailed, 1, "{exc}; nothing written")),
)


if __name__ == "__main__":
    sys.exit(main())
