"""``python -m export.gpu_versions``: says in one line whether this interpreter can install the GPU extras
(``make gpu-venv`` runs it first: pip itself only says "no matching distribution"), and ``--driver
[VERSION]`` which extra a driver (this machine's by default) needs. The pins themselves live in
:mod:`qa_core.runtime.gpu_stacks`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from qa_core.runtime.gpu import nvidia_driver_version
from qa_core.runtime.gpu_stacks import (
    DEFAULT_STACK,
    STACKS,
    TENSORRT_VERSION,
    driver_advice,
    index_problem,
    python_problem,
    stack_for_driver,
    stack_for_extra,
    version_tuple,
)


def this_machines_driver() -> str | None:
    """The installed NVIDIA driver's version (nvidia-smi, else the kernel module); None without one."""
    return nvidia_driver_version()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export.gpu_versions",
        description="Can this Python install the GPU extras, is their package index reachable, and which "
        "extra does an NVIDIA driver need?",
    )
    p.add_argument("--tensorrt", action="store_true", help="also the TensorRT extra")
    p.add_argument("--index", help="check that this package index answers (pip's proxy variables apply)")
    p.add_argument(
        "--extra",
        choices=[s.extra for s in STACKS],
        help="the stack that extra installs (default: the one this machine's NVIDIA driver runs, else "
        f"{DEFAULT_STACK.extra})",
    )
    p.add_argument(
        "--print",
        choices=["onnxruntime-gpu", "tensorrt", "extra", "tensorrt-extra"],
        help="print a pinned version, or the extras to install, of the stack (see --extra) and exit",
    )
    p.add_argument(
        "--driver",
        nargs="?",
        const="",
        metavar="VERSION",
        help="say which extra an NVIDIA driver version (default: this machine's) needs, and exit",
    )
    args = p.parse_args(argv)
    if args.driver is not None:
        driver = args.driver or this_machines_driver()
        if not driver:
            print(
                "error: no NVIDIA driver here (nvidia-smi, /proc/driver/nvidia/version); name one: --driver 550.54.15",
                file=sys.stderr,
            )
            return 1
        if version_tuple(driver) is None:
            print(f"error: --driver {driver!r}: not a driver version like 580.65.06", file=sys.stderr)
            return 2
        print(driver_advice(driver))
        return 0 if stack_for_driver(driver) else 1
    # the stack: --extra's, else the one this machine's driver runs, else the default (no driver here)
    driver = None if args.extra else this_machines_driver()
    if driver and stack_for_driver(driver) is None:
        print(f"error: {driver_advice(driver)}", file=sys.stderr)
        return 1
    stack = (
        (stack_for_extra(args.extra) if args.extra else None)
        or (stack_for_driver(driver) if driver else None)
        or DEFAULT_STACK
    )
    if args.print:
        print(
            {
                "onnxruntime-gpu": stack.onnxruntime_gpu,
                "tensorrt": TENSORRT_VERSION,
                "extra": stack.extra,
                "tensorrt-extra": stack.tensorrt_extra,
            }[args.print]
        )
        return 0
    problem = python_problem(tensorrt=args.tensorrt, stack=stack)
    if problem is None and args.index:
        problem = index_problem(args.index)
        if problem and args.tensorrt:
            problem = (
                f"TensorRT's PyPI packages ({stack.tensorrt_package}) are stubs that download the real wheels "
                f"from NVIDIA's index, and {problem}: let pip reach it (HTTPS_PROXY), or install TensorRT "
                f"{TENSORRT_VERSION} from NVIDIA's tar/deb packages with its Python wheel, then run make gpu-test"
            )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
