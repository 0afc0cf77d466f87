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

from export.onnx.exporter import export_onnx
from export.onnx.options import PROG, OnnxExportOptions, VerificationFailed
from train.common.cli import Failure, OptionsCommand, Parser, to_stderr
from train.common.dataclass_flags import add_flags, options_from

__all__ = ["build_parser", "main", "options_from_args"]


def build_parser() -> Parser:
    """One flag per field of :class:`OnnxExportOptions` (its type, default and help)."""
    p = Parser(prog=PROG, description="Export a QA checkpoint (ours or HuggingFace XLNet) to ONNX.")
    add_flags(p, OnnxExportOptions)
    return p


def options_from_args(args: argparse.Namespace) -> OnnxExportOptions:
    """The parsed flags as options (the flags' dests are the options' field names)."""
    return options_from(OnnxExportOptions, args)


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
