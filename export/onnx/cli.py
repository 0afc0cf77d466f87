"""Export a QA checkpoint to ONNX, verify it against PyTorch, optimise it, optionally reduce its precision.

    python -m export.onnx --checkpoint runs/squad --out runs/export-fp32 [--opset 17] [--precision fp32|fp16|int8]
        [--head H] [--no-verify] [--optimize/--no-optimize] [--agreement-data dev.json --agreement-max N]

The command line of `export.onnx.exporter` (the steps and why they are so are described there): one flag
per field of :class:`OnnxExportOptions`, progress on stdout, warnings on stderr. Exit codes: 0 written; 1
the export does not verify (nothing written) or writing failed; 2 a user error (one line, no traceback).
"""

from __future__ import annotations

import sys

from export.onnx.exporter import export_onnx
from export.onnx.options import PROG, OnnxExportOptions, VerificationFailed
from train.common.cli import Failure, to_stderr
from train.common.dataclass_flags import flags_command

__all__ = ["build_parser", "main", "options_from_args"]

main = flags_command(
    PROG,
    "Export a QA checkpoint (ours or HuggingFace XLNet) to ONNX.",
    OnnxExportOptions,
    lambda options: export_onnx(options, report=print, warn=to_stderr),
    failures=(Failure(VerificationFailed, 1, "verification failed, nothing written: {exc}"),),
)
build_parser, options_from_args = main.build_parser, main.options_from_args

if __name__ == "__main__":
    sys.exit(main())
