"""The GPU tests' gate: skip where there is no GPU stack, but *fail* when ``XLNETQA_REQUIRE_GPU`` says so.

On a GPU machine a broken install (CPU onnxruntime shadowing onnxruntime-gpu, a missing libnvinfer)
looks exactly like "no GPU here"; with ``XLNETQA_REQUIRE_GPU=1`` (`make gpu-test` in the complete GPU
venv) every such gap is a failure. ``XLNETQA_REQUIRE_GPU=device`` is for a GPU machine whose Python
lacks packages it cannot fetch (no package index): a CUDA device is still required, and a test whose
package is missing is skipped with "missing package NAME", so the run lists what it could not test.
"""

from __future__ import annotations

import importlib.util
import os
from typing import NoReturn

import pytest

from qa_core.runtime.gpu import cuda_device_problem, gpu_stack_problem, installed_stack

REQUIRE_ENV = "XLNETQA_REQUIRE_GPU"
MISSING = "missing package"


def required_mode() -> str:
    """ "all" (everything GPU must run), "device" (a CUDA device must be there) or "" (skip freely)."""
    value = os.environ.get(REQUIRE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "all"):
        return "all"
    return "device" if value == "device" else ""


def gpu_required() -> bool:
    return required_mode() == "all"


def unavailable(reason: str, *, device: bool = False) -> NoReturn:
    """Skip with ``reason``, or fail with it when the GPU tests were required (``device``: the reason is
    a missing CUDA device, which fails in both required modes)."""
    mode = required_mode()
    if mode == "all" or (mode == "device" and device):
        pytest.fail(f"{REQUIRE_ENV}={os.environ[REQUIRE_ENV]} but {reason}", pytrace=False)
    pytest.skip(reason)


# module -> pip package: what a server needs beyond torch and numpy
SERVING_PACKAGES = {"fastapi": "fastapi", "uvicorn": "uvicorn", "pydantic_settings": "pydantic-settings"}


def require_package(module: str, package: str) -> None:
    """Skip (or fail when everything is required) naming ``package`` when ``module`` is not importable."""
    if importlib.util.find_spec(module) is None:
        unavailable(f"{MISSING} {package} (python -m {module} is not importable here)")


def require_cuda_device() -> None:
    problem = cuda_device_problem()  # no GPU, or a driver too old for the CUDA runtime, and which
    if problem:
        unavailable(problem, device=True)


def require_torch_cuda() -> None:
    """A CUDA device that torch can use: torch installed (a GPU venv may have none), a CUDA build of it,
    and a visible device, each named when it is what is missing."""
    try:
        import torch
    except ImportError:
        unavailable(f"torch is not installed ({MISSING} torch; the CUDA tests need its CUDA build)")
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}"
        if torch.version.cuda is None:
            unavailable(f"{build} is a CPU-only build; install the CUDA build of torch")
        unavailable(f"{build} (CUDA {torch.version.cuda}) sees no CUDA device", device=True)


def require_tensorrt() -> None:
    require_cuda_device()
    require_package("tensorrt", installed_stack(None).tensorrt_package)
    require_package("cuda.bindings", "cuda-bindings")
    problem = gpu_stack_problem()
    if problem:
        unavailable(problem)


def require_provider(provider: str) -> None:
    """A CUDA device and an onnxruntime build that offers ``provider``."""
    require_cuda_device()
    require_package("onnxruntime", "onnxruntime-gpu")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        unavailable(f"{MISSING} onnxruntime-gpu (onnxruntime {ort.__version__} here is the CPU wheel)")
    from qa_core.runtime.probe import preload_gpu_libraries

    preload_gpu_libraries([provider])  # as the server does: NVIDIA's pip wheels are not on the loader path
    if provider not in ort.get_available_providers():
        unavailable(
            f"{provider} is not in this onnxruntime build ({ort.__version__}, providers "
            f"{ort.get_available_providers()}); install onnxruntime-gpu alone (make gpu-venv)"
        )
