"""Inference backends behind one interface; each is imported only when chosen (torch only for ``torch``)."""

from __future__ import annotations

from qa_core.runtime.backends import NULL, ONNX, SERVER_BACKENDS, TORCH, TRT
from server.answering.model_spec import ModelSpec
from server.backends.base import Backend, BackendUnavailable, dummy_batch
from server.settings import ServerSettings

__all__ = [
    "Backend",
    "BackendUnavailable",
    "batch_limit",
    "check_spec",
    "create_backend",
    "dummy_batch",
    "preflight",
]


def preflight(settings: ServerSettings) -> None:
    """Checks before the server starts listening (missing packages, a GPU provider that does not run a
    probe session, no GPU, an unusable cache directory -> BackendUnavailable with one line saying what
    to do). Fast: the probe session is a tiny model."""
    import importlib.util

    backend, providers = settings.backend, settings.provider_list()
    if backend == "onnx" and importlib.util.find_spec("onnxruntime") is None:
        raise BackendUnavailable("--backend onnx needs onnxruntime (pip install 'xlnet-qa[serve]')")
    if backend == "onnx":  # settings before installs
        from server.backends.onnx import prepare_trt_cache_dir

        prepare_trt_cache_dir(settings.trt_cache_dir, providers)
    if backend == "onnx" and providers:
        from server.backends.onnx import check_providers

        check_providers(providers, settings)
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        raise BackendUnavailable("--backend torch needs torch (pip install 'xlnet-qa[train]')")
    if backend == "torch" and settings.torch_device != "cpu":
        from server.backends.torch import torch_device_problem

        problem = torch_device_problem(settings.torch_device)
        if problem:
            raise BackendUnavailable(problem)
    if backend == TRT:
        from server.backends.trt import _check_available

        _check_available()


def batch_limit(spec: ModelSpec, settings: ServerSettings) -> int:
    """The most windows in one backend call: the setting, within what the model (an engine) accepts."""
    return min(settings.max_batch_size, spec.max_batch_size or settings.max_batch_size)


def create_backend(spec: ModelSpec, settings: ServerSettings) -> Backend:
    """Build the backend named by ``settings.backend`` for ``spec`` (slow: loads the model)."""
    if settings.backend == ONNX:
        from server.backends.onnx import OnnxBackend

        return OnnxBackend.from_settings(spec, settings)
    if settings.backend == TRT:
        from server.backends.trt import TrtBackend

        return TrtBackend(spec, settings.device_id)
    if settings.backend == TORCH:
        from server.backends.buckets import BucketGrid
        from server.backends.torch import TorchBackend

        grid = BucketGrid.for_server(
            batch_limit(spec, settings),
            spec.serving.max_seq_len,
            settings.pad_multiple_of,
            spec.min_engine_seq_len or 1,
        )
        return TorchBackend(
            spec,
            settings.threads,
            settings.inter_op_threads,
            settings.torch_device,
            dtype=settings.torch_dtype,
            graphs=settings.torch_graphs,
            grid=grid,
        )
    if settings.backend == NULL:
        from server.backends.null import NullBackend

        return NullBackend(spec)
    raise BackendUnavailable(f"unknown backend {settings.backend!r}; choose one of {SERVER_BACKENDS}")


def check_spec(spec: ModelSpec, settings: ServerSettings) -> None:
    """What the model itself rules out before listening: an int8 export on a GPU provider."""
    from qa_core.runtime.providers import GPU_PROVIDERS, INT8_CPU_ONLY

    providers = settings.provider_list() or []
    if settings.backend == "onnx" and spec.precision == "int8" and any(p in GPU_PROVIDERS for p in providers):
        raise BackendUnavailable(f"--providers {','.join(providers)}: {INT8_CPU_ONLY}")
