"""Is the NVIDIA stack here? One sentence saying what is missing and how to get it, or None.

TensorRT engines are built on, and only run on, the GPU model they were built for, so both the
`tensorrt` package and a CUDA device (seen through torch, which the runtime uses for buffers) are needed.
"""

from __future__ import annotations

INSTALL_HINT = 'pip install ".[gpu]" on a machine with an NVIDIA GPU'


def gpu_stack_problem() -> str | None:
    """What is missing for TensorRT, checked in order: the tensorrt module, then a CUDA device."""
    try:
        import tensorrt  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: the wheel is there but libnvinfer cannot load
        return f"TensorRT is not available ({type(exc).__name__}: {exc}); install it with {INSTALL_HINT}"
    try:
        import torch
    except ImportError:
        return f"PyTorch is not installed (the TensorRT runtime uses it for GPU buffers); {INSTALL_HINT}"
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return (
            f"no CUDA GPU is available (torch {torch.__version__}, {build}, sees none); TensorRT builds "
            f"and runs engines on the GPU itself: use {INSTALL_HINT}"
        )
    return None
