"""Build a TensorRT engine from an ONNX export directory and write a TensorRT export directory.

    python -m export.trt --onnx exports/onnx --out exports/trt [--min-shape 1x4] --opt-shape 8x384 \\
        --max-shape 32x512 [--fp16] [--timing-cache FILE] [--workspace-gb N] [--no-verify]

The command line of `export.trt.build` (the precision paths and the profile checks are described there):
one flag per field of :class:`TrtBuildOptions`, progress on stdout, warnings on stderr. Exit codes: 0 written; 1 TensorRT
could not parse or build the network, or the engine does not verify (nothing written), or writing failed;
2 a user error, or no TensorRT or usable CUDA GPU here (one line saying which and how to get it).
"""

from __future__ import annotations

import sys

from export.trt.build import PROG, BuildFailed, StackUnavailable, TrtBuildOptions, build_trt, shape_flag
from train.common.cli import Failure, to_stderr
from train.common.dataclass_flags import flags_command

__all__ = ["PROG", "build_parser", "main", "options_from_args", "shape_flag"]

main = flags_command(
    PROG,
    "Build a TensorRT engine from an ONNX export directory.",
    TrtBuildOptions,
    lambda options: build_trt(options, report=print, warn=to_stderr),
    failures=(Failure(StackUnavailable, 2), Failure(BuildFailed, 1, "{exc}; nothing written")),
)
build_parser, options_from_args = main.build_parser, main.options_from_args

if __name__ == "__main__":
    sys.exit(main())
