"""Export a QA checkpoint to ONNX, verify it against PyTorch, optimise it, optionally reduce its precision.

    python -m export.onnx --checkpoint runs/squad --out runs/export-fp32 [--opset 17] [--precision fp32|fp16|int8]
        [--head H] [--no-verify] [--optimize/--no-optimize] [--agreement-data dev.json --agreement-max N]

The command line of `export.onnx.exporter` (the steps and why they are so are described there): flags ->
:class:`OnnxExportOptions`, progress on stdout, warnings on stderr. Exit codes: 0 written; 1 the export
does not verify (nothing written) or writing failed; 2 a user error (one line, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from export.onnx.exporter import export_onnx
from export.onnx.options import PROG, OnnxExportOptions, VerificationFailed
from export.serving.providers import canonical_provider
from export.serving.sidecar import PRECISIONS
from train.common.cli import Failure, OptionsCommand, Parser, to_stderr
from train.model import HEADS

__all__ = ["build_parser", "main", "options_from_args"]


def provider_flag(text: str) -> str:
    """``cuda`` -> ``CUDAExecutionProvider``; argparse's one-line error for an unknown name."""
    try:
        return canonical_provider(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Export a QA checkpoint (ours or HuggingFace XLNet) to ONNX.")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (ours or HuggingFace XLNet)")
    p.add_argument("--out", required=True, help="export directory to create (an existing export is replaced)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument(
        "--head", choices=HEADS, help="QA head; LM/base checkpoints need it and get an UNTRAINED head"
    )
    p.add_argument("--tokenizer", help="tokenizer directory, when the checkpoint has no spiece.model")
    p.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip the onnxruntime-vs-PyTorch check"
    )
    p.add_argument(
        "--verify-provider",
        dest="verify_providers",
        action="append",
        default=[],
        type=provider_flag,
        metavar="PROVIDER",
        help="also verify on this onnxruntime provider (cuda, tensorrt, cpu; repeatable): the graph it would "
        "serve, on that provider; a session that falls back to another provider fails the export",
    )
    p.add_argument(
        "--optimize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="offline onnxruntime optimisation (fp32, int8), kept only if it verifies",
    )
    p.add_argument("--per-channel", action="store_true", help="int8: per-channel weight scales")
    p.add_argument("--quantize-heads", action="store_true", help="int8: quantize the QA heads' MatMuls too")
    p.add_argument(
        "--tolerance",
        type=float,
        help="max |diff| vs PyTorch relative to max(1, max |output|) (default fp32 1e-4; fp16 5e-2, int8 0.5)",
    )
    p.add_argument(
        "--threads", type=int, help="onnxruntime intra-op threads (default: $OMP_NUM_THREADS or cores)"
    )
    p.add_argument("--agreement-data", help="SQuAD json: compare decoded answers with PyTorch fp32")
    p.add_argument(
        "--agreement-max", type=int, default=0, help="questions used from --agreement-data (0: all)"
    )
    p.add_argument(
        "--benchmark", type=int, default=0, metavar="RUNS", help="time RUNS calls (batch 1 x max_seq_len)"
    )
    return p


def options_from_args(args: argparse.Namespace) -> OnnxExportOptions:
    """The parsed flags as options (the flags' dests are the options' field names)."""
    values = {**vars(args), "checkpoint": Path(args.checkpoint), "out": Path(args.out)}
    return OnnxExportOptions(**{**values, "verify_providers": tuple(args.verify_providers)})


def export(options: OnnxExportOptions) -> None:
    export_onnx(options, report=print, warn=to_stderr)


# Entry point: user errors -> one line and exit 2; a failed verification -> exit 1.
main = OptionsCommand(
    PROG,
    build_parser,
    options_from_args,
    export,
    failures=(Failure(VerificationFailed, 1, "verification failed, nothing written: {exc}"),),
)


if __name__ == "__main__":
    sys.exit(main())
