"""Is the NVIDIA stack here? GPU detection that does not depend on the installed torch build, and one
sentence saying what is missing and how to get it.

A CPU build of torch says "no CUDA" on an H100, so devices are counted through the CUDA runtime's own
Python bindings (``cuda-bindings``, which the ``gpu`` extra installs) and, without them, through the
driver (``nvidia-smi``, ``/proc/driver/nvidia/gpus``). When the runtime lists no device it also says why
(:func:`cuda_device_problem`): a driver older than the CUDA runtime fails the same call as a machine
without a GPU, and the fix is a driver upgrade, not another machine. Torch-free.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from qa_core.runtime.gpu_stacks import (
    DEFAULT_STACK,
    GpuStack,
    stack_for_cuda,
    stack_for_driver,
    stack_for_onnxruntime,
)

INSTALL_HINT = 'pip install ".[gpu,tensorrt]" on a machine with an NVIDIA GPU (or: make gpu-venv-tensorrt)'
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
NO_DEVICE = "no CUDA GPU is visible"
# cudaError_t codes cudaGetDeviceCount answers with when it finds no usable device.
CUDA_ERROR_INSUFFICIENT_DRIVER = 35  # the driver is older than the CUDA runtime (or absent)
CUDA_ERROR_NO_DEVICE = 100  # the driver lists no device (none, or CUDA_VISIBLE_DEVICES hides them)


def import_cudart() -> Any | None:
    """The CUDA runtime module of cuda-bindings (``cuda.bindings.runtime``, 12.8+; ``cuda.cudart`` in older
    cuda-python), or None when neither is installed."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _text(result: Any) -> str:
    """The string a cuda-bindings call returns last (bytes decoded)."""
    text = result[-1] if isinstance(result, tuple) else result
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def error_string(cudart: Any, err: Any) -> str:
    """CUDA's description of an error code ("" if even that call fails)."""
    try:
        return _text(cudart.cudaGetErrorString(err))
    except Exception:  # noqa: BLE001 - only used to decorate an error that is already being reported
        return ""


def error_name(cudart: Any, err: Any) -> str:
    """The ``cudaError_t`` member's name ("cudaErrorNoDevice"), from the enum or cudaGetErrorName."""
    name = getattr(err, "name", None)
    if name:
        return str(name)
    try:
        return _text(cudart.cudaGetErrorName(err))
    except Exception:  # noqa: BLE001 - a name only decorates the message
        return f"cudaError {int(err)}"


def cuda_version_text(version: int) -> str | None:
    """CUDA's integer version as MAJOR.MINOR (12020 -> "12.2"); None for 0 (no driver) or less."""
    return f"{version // 1000}.{version % 1000 // 10}" if version > 0 else None


def _cuda_version(cudart: Any, call: str) -> str | None:
    """cudaDriverGetVersion / cudaRuntimeGetVersion as MAJOR.MINOR; None if the call fails."""
    try:
        err, version = getattr(cudart, call)()
    except Exception:  # noqa: BLE001 - a version only decorates the message
        return None
    return cuda_version_text(int(version)) if int(err) == 0 else None


def nvidia_driver_version() -> str | None:
    """The installed NVIDIA driver's version ("535.104.05"): nvidia-smi's, else the kernel module's; None
    without either."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            out = None
        lines = out.stdout.split() if out is not None and out.returncode == 0 else []
        if lines:
            return lines[0]
    try:
        text = PROC_DRIVER_VERSION.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
    return match[1] if match else None


def _count_with_cuda_bindings(cudart: Any) -> tuple[Any, int] | None:
    """cudaGetDeviceCount's ``(cudaError_t, devices)`` (honours CUDA_VISIBLE_DEVICES); None when the
    binding cannot load libcudart."""
    try:
        err, count = cudart.cudaGetDeviceCount()
    except Exception:  # noqa: BLE001 - a binding that cannot load libcudart: ask the driver instead
        return None
    return err, int(count) if int(err) == 0 else 0


def _count_with_driver() -> int:
    """Devices the driver lists (nvidia-smi, else /proc); 0 where there is no NVIDIA driver."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0:
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    return len(list(PROC_GPUS.iterdir())) if PROC_GPUS.is_dir() else 0


def cuda_device_count() -> int:
    """NVIDIA GPUs usable here, whatever torch build (if any) is installed."""
    cudart = import_cudart()
    counted = _count_with_cuda_bindings(cudart) if cudart is not None else None
    return _count_with_driver() if counted is None else counted[1]


def cuda_device_problem() -> str | None:
    """Why no CUDA device is usable here, in one sentence that says what to do; None when one is.

    Tells apart no GPU (cudaErrorNoDevice), a driver too old for the CUDA runtime
    (cudaErrorInsufficientDriver: the installed driver and the CUDA version needed are named) and any
    other error of the runtime. Without cuda-bindings, the driver's own listing decides.
    """
    cudart = import_cudart()
    counted = _count_with_cuda_bindings(cudart) if cudart is not None else None
    if counted is None:
        if _count_with_driver():
            return None
        return f"{NO_DEVICE} (nvidia-smi and /proc/driver/nvidia list none): use {INSTALL_HINT}"
    err, count = counted
    code = int(err)
    if code == 0:
        return None if count else f"{NO_DEVICE} (the CUDA runtime lists none): use {INSTALL_HINT}"
    error = f"{error_name(cudart, err)} ({code})"
    if code == CUDA_ERROR_NO_DEVICE:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return (
                f"{NO_DEVICE} ({error} with CUDA_VISIBLE_DEVICES={visible!r}): list a GPU there, or unset it"
            )
        return f"{NO_DEVICE} (the CUDA runtime reports {error}): use {INSTALL_HINT}"
    if code == CUDA_ERROR_INSUFFICIENT_DRIVER:
        return _driver_too_old(cudart, error)
    driver = nvidia_driver_version()
    return (
        f"the CUDA runtime cannot use a GPU: cudaGetDeviceCount failed with {error}: "
        f"{error_string(cudart, err)}" + (f" (NVIDIA driver {driver})" if driver else "")
    )


def installed_stack(runtime_cuda: str | None) -> GpuStack:
    """The pinned stack this environment holds: the CUDA runtime's major version (cuda-bindings 12 or 13),
    else the installed onnxruntime-gpu's pin, else the default stack."""
    major = int(runtime_cuda.split(".")[0]) if runtime_cuda else None
    try:
        ort_gpu: str | None = importlib.metadata.version("onnxruntime-gpu")
    except importlib.metadata.PackageNotFoundError:
        ort_gpu = None
    return stack_for_cuda(major) or stack_for_onnxruntime(ort_gpu) or DEFAULT_STACK


def _driver_too_old(cudart: Any, error: str) -> str:
    """cudaErrorInsufficientDriver: the driver installed, the CUDA version the runtime and the installed
    stack need, and which extra the driver does run."""
    driver_cuda = _cuda_version(cudart, "cudaDriverGetVersion")  # the newest CUDA the driver supports
    runtime_cuda = _cuda_version(cudart, "cudaRuntimeGetVersion")
    driver = nvidia_driver_version()
    stack = installed_stack(runtime_cuda)
    needed = (
        f"the CUDA runtime here is {runtime_cuda or '(version unknown)'}, and {stack.describe()} needs "
        f"{stack.needed_driver}"
    )
    if driver is None and driver_cuda is None:
        return f"the CUDA runtime finds no NVIDIA driver ({error}): {needed}; install one"
    installed = "NVIDIA driver" + (f" {driver}" if driver else "")
    if driver_cuda:
        installed += f" (supports CUDA up to {driver_cuda})"
    # the stack this driver runs: by its version, else by the newest CUDA version it supports
    runs = stack_for_driver(driver) if driver else stack_for_cuda(int(str(driver_cuda).split(".")[0]))
    if runs is not None and runs != stack:
        advice = f"this driver runs {runs.describe()}: pip install '.[{runs.extra}]' instead, or upgrade the driver"
    else:
        advice = "upgrade the driver"
    return f"the installed {installed} is too old ({error}): {needed}; {advice}"


def gpu_stack_problem() -> str | None:
    """What is missing for TensorRT, checked in order: the tensorrt module, the CUDA runtime bindings
    (the engine runner's device buffers and stream), then a usable CUDA device."""
    try:
        import tensorrt  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: the wheel is there but libnvinfer cannot load
        return f"TensorRT is not available ({type(exc).__name__}: {exc}); install it with {INSTALL_HINT}"
    if import_cudart() is None:
        return (
            "the CUDA runtime bindings (cuda-bindings) are not installed; the TensorRT runner keeps its "
            f"buffers through them: install them with {INSTALL_HINT}"
        )
    problem = cuda_device_problem()
    return f"{problem} (TensorRT builds and runs engines on the GPU itself)" if problem else None
