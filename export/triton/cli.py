"""Write a Triton Inference Server model repository entry for an ONNX or TensorRT export.

    python -m export.triton --onnx exports/onnx [--trt exports/trt] --out triton_repo [--name xlnet_qa] \\
        [--max-batch-size 32] [--preferred-batch 4,8,16] [--max-queue-delay-us 500] [--instances 1] \\
        [--triton-tensorrt 10.14.1]

The command line of `export.triton.repository` (the layout and the checks are described there): flags ->
:class:`TritonOptions`. Exit codes: 0 written; 1 writing failed; 2 a user error (one line, no traceback).
"""

from __future__ import annotations

import argparse
import sys

from export.triton.repository import TritonOptions, write_repository
from train.common.cli import OptionsCommand, Parser
from train.common.dataclass_flags import add_flags, options_from

PROG = "python -m export.triton"


def build_parser() -> Parser:
    """One flag per field of :class:`TritonOptions` (its type, default and help)."""
    p = Parser(prog=PROG, description="Write a Triton model repository entry for an export.")
    add_flags(p, TritonOptions)
    return p


def options_from_args(args: argparse.Namespace) -> TritonOptions:
    """The parsed flags as options (the flags' dests are the options' field names)."""
    return options_from(TritonOptions, args)


def write(options: TritonOptions) -> None:
    write_repository(options, report=print)


# Entry point: user errors -> one line and exit 2.
main = OptionsCommand(PROG, build_parser, options_from_args, write)


if __name__ == "__main__":
    sys.exit(main())
