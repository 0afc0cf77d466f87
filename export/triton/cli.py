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

from export.serving.gpu_stacks import TENSORRT_VERSION, release_problem
from export.triton.repository import INSTANCE_KINDS, TritonOptions, write_repository
from train.common.cli import OptionsCommand, Parser

PROG = "python -m export.triton"


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 4,8,16, got {text!r}")
    return values


def tensorrt_version(text: str) -> str:
    if problem := release_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Write a Triton model repository entry for an export.")
    p.add_argument("--onnx", required=True, help="ONNX export directory (python -m export.onnx)")
    p.add_argument("--trt", help="TensorRT export directory (python -m export.trt): serve the engine instead")
    p.add_argument("--out", required=True, help="model repository directory")
    p.add_argument("--name", default="xlnet_qa", help="model name in the repository")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument(
        "--preferred-batch", type=int_list, help="comma-separated batch sizes (default: 4,8,16 up to the max)"
    )
    p.add_argument("--max-queue-delay-us", type=int, default=500, help="dynamic batcher wait (microseconds)")
    p.add_argument("--instances", type=int, default=1, help="model instances (instance_group count)")
    p.add_argument("--instance-kind", choices=INSTANCE_KINDS, default="gpu")
    p.add_argument(
        "--triton-tensorrt",
        type=tensorrt_version,
        default=TENSORRT_VERSION,
        metavar="VERSION",
        help="TensorRT version of the Triton container that serves a --trt plan (must match the plan's)",
    )
    return p


def options_from_args(args: argparse.Namespace) -> TritonOptions:
    """The parsed flags as options (the flags' dests are the options' field names; paths as given, so
    messages quote them as typed)."""
    return TritonOptions(**vars(args))


def write(options: TritonOptions) -> None:
    write_repository(options, report=print)


# Entry point: user errors -> one line and exit 2.
main = OptionsCommand(PROG, build_parser, options_from_args, write)


if __name__ == "__main__":
    sys.exit(main())
