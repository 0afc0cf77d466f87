"""Is the NVIDIA stack here? GPU detection that does not depend on the installed torch build, and one
sentence saying what is missing and how to get it.

A CPU build of torch says "no CUDA" on an H100, so devices are counted through the CUDA runtime's own
Python bindings (``cuda-bindings``, which the ``gpu`` extra installs) and, without them, through the
driver (``nvidia-smi``, ``/proc/driver/nvidia/gpus``). Torch-free.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

INSTALL_HINT = 'pip install ".[gpu]" on a machine with an NVIDIA GPU (or: make gpu-venv)'
PROC_GPUS = Path("/proc/driver/nvidia/gpus")


def import_cudart() -> Any | None:
    """The CUDA runtime module of cuda-bindings (``cuda.bindings.runtime``, 12.8+; ``cuda.cudart`` in older
    cuda-python), or None when neither is installed."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _count_with_cuda_bindings() -> int | None:
    """Devices the CUDA runtime sees (honours CUDA_VISIBLE_DEVICES); None without usable cuda-bindings."""
    cudart = import_cudart()
    if cudart is None:
        return None
    try:
        err, count = cudart.cudaGetDeviceCount()
    except Exception:  # noqa: BLE001 - a binding that cannot load libcudart: ask the driver instead
        return None
    return int(count) if int(err) == 0 else 0


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
    count = _count_with_cuda_bindings()
    return _count_with_driver() if count is None else count


def gpu_stack_problem() -> str | None:
    """What is missing for TensorRT, checked in order: the tensorrt module, the CUDA runtime bindings
    (the engine runner's device buffers and stream), then a CUDA device."""
    try:
        import tensorrt  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: the wheel is there but libnvinfer cannot load
        return f"TensorRT is not available ({type(exc).__name__}: {exc}); install it with {INSTALL_HINT}"
    if import_cudart() is None:
        return (
            "the CUDA runtime bindings (cuda-bindings) are not installed; the TensorRT runner keeps its "
            f"buffers through them: install them with {INSTALL_HINT}"
        )
    if cuda_device_count() == 0:
        return f"no CUDA GPU is visible (CUDA runtime and driver list none); TensorRT builds and runs engines on the GPU itself: use {INSTALL_HINT}"
    return None
