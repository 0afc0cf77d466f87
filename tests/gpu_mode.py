"""The GPU tests' gate: skip where there is no GPU stack, but *fail* when ``XLNETQA_REQUIRE_GPU=1``.

On a GPU machine a broken install (CPU onnxruntime shadowing onnxruntime-gpu, a missing libnvinfer)
looks exactly like "no GPU here"; with the variable set, `make gpu-test` turns that into a failure.
"""

from __future__ import annotations

import os

import pytest

from export.gpu import cuda_device_problem, gpu_stack_problem

REQUIRE_ENV = "XLNETQA_REQUIRE_GPU"


def gpu_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip with ``reason``, or fail with it when the GPU tests were required."""
    if gpu_required():
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def require_cuda_device() -> None:
    problem = cuda_device_problem()  # no GPU, or a driver too old for the CUDA runtime, and which
    if problem:
        unavailable(problem)


def require_tensorrt() -> None:
    problem = gpu_stack_problem()
    if problem:
        unavailable(problem)


def require_provider(provider: str) -> None:
    """A CUDA device and an onnxruntime build that offers ``provider``."""
    require_cuda_device()
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        unavailable(
            f"{provider} is not in this onnxruntime build ({ort.__version__}, providers "
            f"{ort.get_available_providers()}); install onnxruntime-gpu alone (make gpu-venv)"
        )
