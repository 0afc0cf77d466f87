"""Write a Triton Inference Server model repository entry for an ONNX or TensorRT export.

    python -m export.triton --onnx exports/onnx [--trt exports/trt] --out triton_repo [--name xlnet_qa] \\
        [--max-batch-size 32] [--preferred-batch 4,8,16] [--max-queue-delay-us 500] [--instances 1] \\
        [--triton-tensorrt 10.14.1]

The command line of `export.triton.repository` (the layout and the checks are described there): one flag per
field of :class:`TritonOptions`. Exit codes: 0 written; 1 writing failed; 2 a user error (one line, no traceback).
"""

from __future__ import annotations

import sys

from export.triton.repository import TritonOptions, write_repository
from train.common.dataclass_flags import flags_command

__all__ = ["PROG", "build_parser", "main", "options_from_args"]

PROG = "python -m export.triton"

main = flags_command(
    PROG,
    "Write a Triton model repository entry for an export.",
    TritonOptions,
    lambda options: write_repository(options, report=print),
)
build_parser, options_from_args = main.build_parser, main.options_from_args

if __name__ == "__main__":
    sys.exit(main())
