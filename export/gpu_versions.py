"""The GPU stack's versions, in one place: what pyproject's ``gpu`` and ``tensorrt`` extras pin, which
Pythons and platforms those wheels exist for, and what engines must match.

``python -m export.gpu_versions [--tensorrt]`` says in one line whether this interpreter can install the
GPU extras (``make gpu-venv`` runs it first): pip itself only says "no matching distribution".

A serialized TensorRT engine (a "plan") only deserializes on the TensorRT release that built it, so the
version that builds engines (``python -m export.trt``), the one the server loads them with, and the one
inside the Triton container must be the same. onnxruntime-gpu 1.24's TensorRT execution provider is built
against TensorRT 10.14, so the pinned ``tensorrt-cu12`` wheel is that release too. Torch-free.
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
from collections.abc import Sequence

TENSORRT_VERSION = "10.14.1.48"
TENSORRT_WHEEL = "tensorrt-cu12==10.14.1.48.post1"
ONNXRUNTIME_GPU_VERSION = "1.24.4"
ONNXRUNTIME_GPU_WHEEL = f"onnxruntime-gpu[cuda,cudnn]=={ONNXRUNTIME_GPU_VERSION}"
CUDA_BINDINGS_REQUIREMENT = "cuda-bindings>=12.8,<13"
# CPython versions and platforms the pinned wheels are published for on PyPI (as listed by
# the index: onnxruntime-gpu 1.24.4 cp311-cp314; tensorrt-cu12-bindings 10.14.1.48.post1 cp38-cp313).
WHEEL_PYTHONS = {
    "onnxruntime-gpu": ((3, 11), (3, 14)),
    "tensorrt-cu12": ((3, 8), (3, 13)),
}
WHEEL_PLATFORMS = {("Linux", "x86_64"), ("Windows", "AMD64")}
# onnxruntime-gpu 1.24.4, tensorrt-cu12 and cuda-bindings<13 are CUDA 12 builds.
STACK_CUDA_MAJOR = 12
# The oldest Linux driver that runs CUDA 12.x (minor version compatibility; CUDA Toolkit release notes,
# "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility": CUDA 12.x,
# >= 525.60.13 on Linux x86_64).
CUDA_DRIVER_MINIMUM = "525.60.13"
TRITON_GUIDANCE = (
    "serve TensorRT plans with the Triton release whose container ships TensorRT 10.14.x; check NVIDIA's "
    "Frameworks Support Matrix"
)
REBUILD_HINT = (
    "rebuild the engine with `python -m export.trt` on the serving machine (for Triton: with the TensorRT "
    "of the Triton container, see --triton-tensorrt)"
)

_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)(?:[.+-]|$)")


def tensorrt_release(version: str) -> tuple[int, int, int] | None:
    """MAJOR.MINOR.PATCH of a TensorRT version string ("10.14.1.48.post1" -> (10, 14, 1)); None if not one."""
    match = _RELEASE.match(version or "")
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def release_problem(version: str) -> str | None:
    """Why ``version`` is not a TensorRT release to name (MAJOR.MINOR.PATCH); None when it is one."""
    if tensorrt_release(version) is None:
        return f"expected a TensorRT version MAJOR.MINOR.PATCH like 10.14.1, got {version!r}"
    return None


def tensorrt_version_problem(built: str, runtime: str, *, where: str = "this machine") -> str | None:
    """Why a plan built with TensorRT ``built`` cannot be loaded by TensorRT ``runtime`` (that of ``where``);
    None if it can.

    Engines are tied to the TensorRT release that built them: major.minor.patch must be equal (the build
    number and wheel suffixes such as ``.post1`` do not change the engine format).
    """
    built_release, runtime_release = tensorrt_release(built), tensorrt_release(runtime)
    if built_release is None:
        return f"the engine's TensorRT version {built!r} is not MAJOR.MINOR.PATCH[.BUILD]; {REBUILD_HINT}"
    if runtime_release is None:
        return f"the TensorRT version of {where}, {runtime!r}, is not MAJOR.MINOR.PATCH[.BUILD]"
    if built_release != runtime_release:
        return (
            f"the engine was built with TensorRT {built} but {where} has TensorRT {runtime}: a plan only "
            f"deserializes on the TensorRT release (major.minor.patch) that built it; {REBUILD_HINT}"
        )
    return None


def python_problem(
    version: tuple[int, int] | None = None,
    system: str | None = None,
    machine: str | None = None,
    *,
    tensorrt: bool = False,
) -> str | None:
    """One line when the GPU wheels pinned here do not exist for this Python or platform; None if they do."""
    version = version or (sys.version_info.major, sys.version_info.minor)
    system, machine = system or platform.system(), machine or platform.machine()
    wheels = ["onnxruntime-gpu", *(["tensorrt-cu12"] if tensorrt else [])]
    low = max(WHEEL_PYTHONS[w][0] for w in wheels)
    high = min(WHEEL_PYTHONS[w][1] for w in wheels)
    here = f"Python {version[0]}.{version[1]} on {system} {machine}"
    span = f"CPython {low[0]}.{low[1]}-{high[0]}.{high[1]}"
    if (system, machine) not in WHEEL_PLATFORMS:
        return f"the GPU wheels ({' and '.join(wheels)}) exist only for Linux x86_64 and Windows AMD64, not {here}"
    if not low <= version <= high:
        pins = ", ".join(
            f"{w} {WHEEL_PYTHONS[w][0][0]}.{WHEEL_PYTHONS[w][0][1]}-{WHEEL_PYTHONS[w][1][0]}.{WHEEL_PYTHONS[w][1][1]}"
            for w in wheels
        )
        return (
            f"this is {here}, but the pinned GPU wheels need {span} ({pins}): make gpu-venv PYTHON=python3.12"
        )
    return None


def index_problem(url: str, timeout_s: float = 10.0) -> str | None:
    """One line when the package index at ``url`` cannot be reached from here (proxies as pip would)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:  # the index answered: reachable
        return None if exc.code < 500 else f"{url} answers HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{url} cannot be reached from here ({reason})"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m export.gpu_versions",
        description="Can this Python install the GPU extras, and is their package index reachable?",
    )
    p.add_argument("--tensorrt", action="store_true", help="also the tensorrt extra")
    p.add_argument("--index", help="check that this package index answers (pip's proxy variables apply)")
    p.add_argument("--print", choices=["onnxruntime-gpu", "tensorrt"], help="print a pinned version and exit")
    args = p.parse_args(argv)
    if args.print:
        print(ONNXRUNTIME_GPU_VERSION if args.print == "onnxruntime-gpu" else TENSORRT_VERSION)
        return 0
    problem = python_problem(tensorrt=args.tensorrt)
    if problem is None and args.index:
        problem = index_problem(args.index)
        if problem and args.tensorrt:
            problem = (
                f"TensorRT's PyPI packages (tensorrt-cu12) are stubs that download the real wheels from NVIDIA's "
                f"index, and {problem}: let pip reach it (HTTPS_PROXY), or install TensorRT {TENSORRT_VERSION} "
                "from NVIDIA's tar/deb packages with its Python wheel, then run make gpu-test"
            )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
