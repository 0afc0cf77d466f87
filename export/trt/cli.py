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

from export.trt.build import PROG, BuildFailed, StackUnavailable, TrtBuildOptions, build_trt, shape_flag
from train.common.cli import Failure, OptionsCommand, Parser, to_stderr
from train.common.dataclass_flags import add_flags, options_from

__all__ = ["PROG", "build_parser", "main", "options_from_args", "shape_flag"]


def build_parser() -> Parser:
    """One flag per field of :class:`TrtBuildOptions` (its type, default and help)."""
    p = Parser(prog=PROG, description="Build a TensorRT engine from an ONNX export directory.")
    add_flags(p, TrtBuildOptions)
    return p


def options_from_args(args: argparse.Namespace) -> TrtBuildOptions:
    """The parsed flags as options (the flags' dests are the options' field names)."""
    return options_from(TrtBuildOptions, args)


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
