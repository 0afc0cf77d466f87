"""The GPU stack's versions, in one place: what pyproject's GPU extras pin, one stack per CUDA major
version, which NVIDIA drivers run each, which Pythons and platforms the wheels exist for, and what
TensorRT engines must match. Read by the exporters, the server's GPU checks, the stack report and
``python -m export.gpu_versions`` (its command line).

Two stacks, because an NVIDIA driver runs the CUDA major versions up to its own and no newer:

- ``gpu`` (+ ``tensorrt``): CUDA 13 -- onnxruntime-gpu 1.31 (its ``[cuda,cudnn]`` extras bring NVIDIA's
  CUDA 13 and cuDNN 9 wheels, the same ones a CUDA build of torch 2.13 from PyPI brings),
  cuda-bindings 13. Needs a driver >= 580.
- ``gpu-cu12`` (+ ``tensorrt-cu12``): CUDA 12 -- onnxruntime-gpu 1.24.4, cuda-bindings 12. Drivers
  >= 525.60.13, for machines that cannot take a 580 driver yet.

A serialized TensorRT engine (a "plan") only deserializes on the TensorRT release that built it, so the
version that builds engines (``python -m export.trt``), the one the server loads them with, and the one
inside the Triton container must be the same: both stacks pin TensorRT 10.14.1 (the CUDA 12 and CUDA 13
builds of one release), so a plan's release does not depend on the stack. Torch-free.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass

TENSORRT_VERSION = "10.14.1.48"
# The oldest Linux driver of each CUDA major version (CUDA Toolkit release notes, table "CUDA Toolkit and
# Minimum Required Driver Version for CUDA Minor Version Compatibility": CUDA 13.x >= 580, CUDA 12.x
# >= 525.60.13 on Linux x86_64). A driver runs every CUDA major up to its own, never a newer one.
CUDA_DRIVER_MINIMUMS = {13: "580", 12: "525.60.13"}


@dataclass(frozen=True)
class GpuStack:
    """One CUDA major version's pinned wheels: the pyproject extras that install them and the drivers
    that run them."""

    cuda_major: int
    extra: str  # onnxruntime-gpu + NVIDIA's CUDA/cuDNN wheels + cuda-bindings (+ the server)
    tensorrt_extra: str
    onnxruntime_gpu: str
    cuda_bindings: str  # requirement
    tensorrt_package: str
    tensorrt_wheel_version: str
    # CPython versions the pinned wheels are published for (onnxruntime-gpu: PyPI's files; TensorRT: the
    # tensorrt-cu*-bindings wheels on https://pypi.nvidia.com).
    onnxruntime_pythons: tuple[tuple[int, int], tuple[int, int]]
    tensorrt_pythons: tuple[tuple[int, int], tuple[int, int]]

    @property
    def onnxruntime_gpu_wheel(self) -> str:
        return f"onnxruntime-gpu[cuda,cudnn]=={self.onnxruntime_gpu}"

    @property
    def tensorrt_wheel(self) -> str:
        return f"{self.tensorrt_package}=={self.tensorrt_wheel_version}"

    @property
    def driver_minimum(self) -> str:
        return CUDA_DRIVER_MINIMUMS[self.cuda_major]

    @property
    def needed_driver(self) -> str:
        return f"a driver that supports CUDA {self.cuda_major}.x (>= {self.driver_minimum} on Linux)"

    def describe(self) -> str:
        """``the gpu extra (onnxruntime-gpu 1.31.1, TensorRT 10.14.1.48, CUDA 13)``."""
        return (
            f"the {self.extra} extra (onnxruntime-gpu {self.onnxruntime_gpu}, TensorRT {TENSORRT_VERSION}, "
            f"CUDA {self.cuda_major})"
        )


CUDA13 = GpuStack(
    cuda_major=13,
    extra="gpu",
    tensorrt_extra="tensorrt",
    onnxruntime_gpu="1.31.1",  # its [cuda] extra: nvidia-cuda-runtime~=13.0 & co.; [cudnn]: nvidia-cudnn-cu13~=9.0
    cuda_bindings="cuda-bindings>=13,<14",
    tensorrt_package="tensorrt-cu13",
    tensorrt_wheel_version="10.14.1.48.post1",
    onnxruntime_pythons=((3, 11), (3, 14)),
    tensorrt_pythons=((3, 8), (3, 13)),  # taken as tensorrt-cu12's (NVIDIA's index was not checked)
)
CUDA12 = GpuStack(
    cuda_major=12,
    extra="gpu-cu12",
    tensorrt_extra="tensorrt-cu12",
    onnxruntime_gpu="1.24.4",
    cuda_bindings="cuda-bindings>=12.8,<13",
    tensorrt_package="tensorrt-cu12",
    tensorrt_wheel_version="10.14.1.48.post1",
    onnxruntime_pythons=((3, 11), (3, 14)),
    tensorrt_pythons=((3, 8), (3, 13)),
)
STACKS = (CUDA13, CUDA12)  # newest first
DEFAULT_STACK = CUDA13
# The default stack's pins under their old names (the extras `gpu` and `tensorrt`).
ONNXRUNTIME_GPU_VERSION = DEFAULT_STACK.onnxruntime_gpu
ONNXRUNTIME_GPU_WHEEL = DEFAULT_STACK.onnxruntime_gpu_wheel
CUDA_BINDINGS_REQUIREMENT = DEFAULT_STACK.cuda_bindings
TENSORRT_WHEEL = DEFAULT_STACK.tensorrt_wheel
WHEEL_PLATFORMS = {("Linux", "x86_64"), ("Windows", "AMD64")}
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


def version_tuple(text: str) -> tuple[int, ...] | None:
    """``"550.54.15"`` -> (550, 54, 15); None when ``text`` is not dotted numbers."""
    parts = (text or "").strip().split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def stack_for_driver(driver: str) -> GpuStack | None:
    """The newest pinned stack an NVIDIA driver version runs; None when it is older than every stack's
    minimum (or not a version)."""
    have = version_tuple(driver)
    if have is None:
        return None
    return next((s for s in STACKS if have >= (version_tuple(s.driver_minimum) or ())), None)


def stack_for_cuda(major: int | None) -> GpuStack | None:
    """The pinned stack of a CUDA major version (a runtime's, or the newest a driver supports)."""
    return next((s for s in STACKS if s.cuda_major == major), None)


def stack_for_onnxruntime(version: str | None) -> GpuStack | None:
    """The stack whose pin an installed onnxruntime-gpu version is; None for an unpinned version."""
    return next((s for s in STACKS if s.onnxruntime_gpu == version), None)


def driver_advice(driver: str) -> str:
    """One line: which extra the NVIDIA driver ``driver`` needs (or that none of them runs on it)."""
    stack = stack_for_driver(driver)
    if stack is None:
        oldest = STACKS[-1]
        return (
            f"NVIDIA driver {driver} is older than every pinned GPU stack supports: the oldest, "
            f"{oldest.describe()}, needs {oldest.needed_driver}; upgrade the driver"
        )
    line = (
        f"NVIDIA driver {driver} runs CUDA {stack.cuda_major} at most: install {stack.describe()}: "
        f"pip install '.[{stack.extra}]'"
    )
    newer = [s for s in STACKS if s.cuda_major > stack.cuda_major]
    if newer:
        line += (
            f" (the {newer[-1].extra} extra, CUDA {newer[-1].cuda_major}, needs {newer[-1].needed_driver})"
        )
    return line


def python_problem(
    version: tuple[int, int] | None = None,
    system: str | None = None,
    machine: str | None = None,
    *,
    tensorrt: bool = False,
    stack: GpuStack = DEFAULT_STACK,
) -> str | None:
    """One line when the GPU wheels of ``stack`` do not exist for this Python or platform; None if they do."""
    version = version or (sys.version_info.major, sys.version_info.minor)
    system, machine = system or platform.system(), machine or platform.machine()
    spans = {"onnxruntime-gpu": stack.onnxruntime_pythons}
    if tensorrt:
        spans[stack.tensorrt_package] = stack.tensorrt_pythons
    wheels = list(spans)
    low = max(span[0] for span in spans.values())
    high = min(span[1] for span in spans.values())
    here = f"Python {version[0]}.{version[1]} on {system} {machine}"
    span = f"CPython {low[0]}.{low[1]}-{high[0]}.{high[1]}"
    if (system, machine) not in WHEEL_PLATFORMS:
        return f"the GPU wheels ({' and '.join(wheels)}) exist only for Linux x86_64 and Windows AMD64, not {here}"
    if not low <= version <= high:
        pins = ", ".join(f"{w} {a[0]}.{a[1]}-{b[0]}.{b[1]}" for w, (a, b) in spans.items())
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


def stack_for_extra(extra: str) -> GpuStack | None:
    """The stack a pyproject extra (``gpu``, ``gpu-cu12``) installs."""
    return next((s for s in STACKS if extra in (s.extra, s.tensorrt_extra)), None)
