"""The GPU stack's versions, in one place: what pyproject's ``gpu`` extra pins and what engines must match.

A serialized TensorRT engine (a "plan") only deserializes on the TensorRT release that built it, so the
version that builds engines (``python -m export.trt``), the one the server loads them with, and the one
inside the Triton container must be the same. onnxruntime-gpu 1.24's TensorRT execution provider is built
against TensorRT 10.14, so the pinned ``tensorrt-cu12`` wheel is that release too. Torch-free.
"""

from __future__ import annotations

import re

TENSORRT_VERSION = "10.14.1.48"
TENSORRT_WHEEL = "tensorrt-cu12==10.14.1.48.post1"
ONNXRUNTIME_GPU_VERSION = "1.24.4"
CUDA_BINDINGS_REQUIREMENT = "cuda-bindings>=12.8,<13"
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
