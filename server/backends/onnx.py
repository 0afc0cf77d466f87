"""onnxruntime backend: CPU with explicit thread counts, or the CUDA / TensorRT providers on a GPU.

Thread counts are always set explicitly: onnxruntime's default (one thread per core) oversubscribes a
machine that runs several workers or shares its cores. Provider choice, options and the graph file
come from ``qa_core.runtime.providers`` (auto = CUDA if it really runs here; TensorRT with caches and a
profile covering the server's batches; GPU providers load the portable graph).

onnxruntime replaces a GPU provider that cannot start (missing CUDA/cuDNN/TensorRT libraries, no GPU,
an old driver) with the CPU and carries on. Here that is a refusal to start: the providers a session
really got are read back with ``get_providers()``, before listening on a tiny probe session
(:func:`check_providers`) and again on the model's own session, and a first provider that is not the
one asked for stops the server with one line naming the likely cause, unless ``--allow-cpu-fallback``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qa_core.runtime.providers import CPU, GPU_PROVIDERS, INT8_CPU_ONLY, TENSORRT, ProviderEntry
from server.answering.model_spec import ModelSpec
from server.backends.base import (
    Backend,
    BackendUnavailable,
    batch_limit,
    check_outputs,
    run_at_least,
)
from server.settings import ServerSettings

logger = logging.getLogger(__name__)

_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def prepare_trt_cache_dir(cache_dir: Path | None, providers: Sequence[str] | None) -> None:
    """Create the TensorRT provider's engine/timing cache directory (no other provider uses it);
    BackendUnavailable naming the flag if it cannot be made."""
    if cache_dir is None or TENSORRT not in (providers or []):
        return
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendUnavailable(f"--trt-cache-dir {cache_dir}: {exc.strerror or exc}") from None


FALLBACK_ADVICE = "fix that, or start with --allow-cpu-fallback to serve from the CPU anyway (20-100x slower)"


def check_providers(providers: Sequence[str], settings: ServerSettings) -> None:
    """Before listening: the wheel offers ``providers`` and a real tiny session runs on the first one;
    BackendUnavailable with one line otherwise (with ``--allow-cpu-fallback`` the backend warns instead)."""
    import onnxruntime

    from qa_core.runtime.probe import fallback_problem, preload_gpu_libraries, probe
    from qa_core.runtime.providers import GPU_PROVIDERS, install_problem, installed_onnxruntime_wheels

    if settings.allow_cpu_fallback:
        return  # the backend probes, warns once and serves from the CPU
    available = onnxruntime.get_available_providers()
    problem = install_problem(providers, available, installed_onnxruntime_wheels())
    if problem is None and providers[0] in GPU_PROVIDERS:
        preload_gpu_libraries(providers)
        problem = fallback_problem(
            probe(probe_entries(providers, settings.device_id)), device_id=settings.device_id
        )
    if problem is not None:
        raise BackendUnavailable(f"--providers: {problem}; {FALLBACK_ADVICE}")


def probe_entries(providers: Sequence[str], device_id: int) -> list[ProviderEntry]:
    """``providers`` with the device option for the GPU ones (the probe runs where the model will)."""
    from qa_core.runtime.providers import GPU_PROVIDERS

    return [(p, {"device_id": str(device_id)}) if p in GPU_PROVIDERS else p for p in providers]


def first_that_runs(providers: Sequence[str], device_id: int) -> list[str]:
    """``providers`` from the first entry a probe session really runs on (the CPU at the latest): with
    ``--allow-cpu-fallback``, TensorRT that does not load falls back to CUDA where CUDA works, not
    straight to the CPU. Each skipped provider is logged as a warning with its cause."""
    from qa_core.runtime.probe import fallback_problem, probe

    for k, provider in enumerate(providers):
        rest = list(providers[k:])
        if provider == CPU:
            return rest
        problem = fallback_problem(probe(probe_entries(rest, device_id)), device_id=device_id)
        if problem is None:
            return rest
        logger.warning("--allow-cpu-fallback: skipping %s: %s", provider, problem)
    return [CPU]


def auto_providers(available: Sequence[str], device_id: int) -> list[str]:
    """``auto``'s candidates: CUDA and the CPU if a probe session really runs on CUDA, else the CPU alone
    (logged). TensorRT is never probed: auto never picks it."""
    from qa_core.runtime.probe import preload_gpu_libraries, probe, why_inactive
    from qa_core.runtime.providers import CUDA

    if CUDA not in available:
        return list(available)
    preload_gpu_libraries([CUDA])
    if probe(probe_entries([CUDA, CPU], device_id)).ok:
        return [CUDA, CPU]
    logger.info(
        "providers auto: CUDA is compiled in but does not run here (%s); using the CPU",
        why_inactive(CUDA, device_id),
    )
    return [CPU]


class OnnxBackend(Backend):
    """One ``InferenceSession`` shared by the inference threads (``run`` is thread-safe in onnxruntime)."""

    name = "onnx"

    def __init__(
        self,
        spec: ModelSpec,
        threads: int = 1,
        inter_op_threads: int = 1,
        providers: Sequence[str] | None = None,
        *,
        max_batch_size: int = 8,
        trt_cache_dir: Path | None = None,
        trt_fp16: bool = False,
        device_id: int = 0,
        allow_cpu_fallback: bool = False,
    ) -> None:
        super().__init__(spec)
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendUnavailable(f"--backend onnx needs onnxruntime ({exc})") from None
        from qa_core.contract import shortest_sequence
        from qa_core.runtime.probe import preload_gpu_libraries
        from qa_core.runtime.providers import ProfileShapes, choose_providers, graph_for, provider_names

        prepare_trt_cache_dir(trt_cache_dir, providers)
        available = ort.get_available_providers()
        self.requested = list(providers) if providers else None
        if providers:
            preload_gpu_libraries(providers)
            if allow_cpu_fallback:  # the first of TensorRT, CUDA, CPU that runs (and so its graph)
                providers = first_that_runs(providers, device_id)
        else:
            available = auto_providers(available, device_id)
        try:
            wanted = choose_providers(
                available,
                providers,
                profile=ProfileShapes(
                    max_batch=max_batch_size,
                    max_seq_len=spec.serving.max_seq_len,
                    min_seq_len=shortest_sequence(
                        spec.head, spec.serving.start_n_top, spec.serving.end_n_top
                    ),
                ),
                trt_cache_dir=trt_cache_dir,
                trt_fp16=trt_fp16,
                device_id=device_id,
                precision=spec.precision,
                allow_fallback=allow_cpu_fallback,
            )
        except ValueError as exc:  # a wheel without the providers (int8 on a GPU is no fallback case)
            advice = "" if spec.precision == "int8" else f"; {FALLBACK_ADVICE}"
            raise BackendUnavailable(f"{exc}{advice}") from None
        model_file = graph_for(
            wanted, spec.model_file or "model.onnx", spec.portable_model_file, spec.precision
        )
        model_path = spec.directory / model_file
        if not model_path.is_file():
            raise BackendUnavailable(f"{model_path}: ONNX model file not found")
        asked = list(providers or provider_names(wanted))
        self.session = self._open(model_path, threads, inter_op_threads, wanted, asked, allow_cpu_fallback)
        self.providers: list[str] = list(self.session.get_providers())
        self.model_file = model_file
        self.threads = threads
        self._check_active(asked, allow_cpu_fallback or not providers)  # auto may settle for the CPU
        logger.info(
            "onnxruntime %s: providers %s on %s, intra-op threads %d",
            ort.__version__,
            self.providers,
            model_file,
            threads,
        )
        session_inputs = {i.name: i.type for i in self.session.get_inputs()}
        unknown = [n for n in session_inputs if n not in self.input_names]
        if unknown:
            raise BackendUnavailable(
                f"{model_path}: unexpected model inputs {unknown} (sidecar: {self.input_names})"
            )
        # An exporter may prune an input the graph does not use; feed only what the session has.
        self._feeds = {n: _NUMPY_TYPES.get(t, np.int64) for n, t in session_inputs.items()}
        session_outputs = [o.name for o in self.session.get_outputs()]
        missing = [n for n in self.output_names if n not in session_outputs]
        if missing:
            raise BackendUnavailable(f"{model_path}: model has no outputs {missing} (has {session_outputs})")

    @staticmethod
    def _open(
        path: Path,
        threads: int,
        inter_op_threads: int,
        wanted: Sequence[ProviderEntry],
        asked: list[str],
        allow_fallback: bool,
    ) -> Any:
        """The model's session; a GPU provider that raises is a refusal, or a CPU session if allowed."""
        from qa_core.runtime.probe import Probe, fallback_problem, first_line
        from qa_core.runtime.sessions import session

        try:
            return session(
                path, threads=threads, inter_op_threads=inter_op_threads, providers=wanted, spinning=False
            )
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types; the message is the fact
            error = first_line(exc)
            if asked[0] == CPU:  # nothing to fall back from: the model itself does not load
                raise BackendUnavailable(f"{path.name}: onnxruntime cannot load it ({error})") from None
            problem = fallback_problem(Probe(asked, error=error))
            if not allow_fallback:
                raise BackendUnavailable(f"{path.name}: {problem}; {FALLBACK_ADVICE}") from None
            logger.warning("--allow-cpu-fallback: %s", problem)
            return session(
                path, threads=threads, inter_op_threads=inter_op_threads, providers=[CPU], spinning=False
            )

    def _check_active(self, asked: list[str], allow_fallback: bool) -> None:
        """The model's own session runs on the first provider asked for (or the fallback was allowed)."""
        from qa_core.runtime.probe import Probe, fallback_problem

        problem = fallback_problem(Probe(asked, active=self.providers))
        if problem is None:
            return
        if not allow_fallback:
            raise BackendUnavailable(f"{problem}; {FALLBACK_ADVICE}")
        logger.warning("--allow-cpu-fallback: serving on %s: %s", self.providers, problem)

    @classmethod
    def preflight(cls, settings: ServerSettings) -> None:
        providers = settings.provider_list()
        prepare_trt_cache_dir(settings.trt_cache_dir, providers)  # settings before installs
        if providers:
            check_providers(providers, settings)

    @classmethod
    def check_spec(cls, spec: ModelSpec, settings: ServerSettings) -> None:
        providers = settings.provider_list() or []
        if spec.precision == "int8" and any(p in GPU_PROVIDERS for p in providers):
            raise BackendUnavailable(f"--providers {','.join(providers)}: {INT8_CPU_ONLY}")

    @classmethod
    def from_settings(cls, spec: ModelSpec, settings: ServerSettings) -> OnnxBackend:
        return cls(
            spec,
            settings.backend_threads,
            settings.inter_op_threads,
            settings.provider_list(),
            max_batch_size=batch_limit(spec, settings),
            trt_cache_dir=settings.trt_cache_dir,
            trt_fp16=settings.trt_fp16,
            device_id=settings.device_id,
            allow_cpu_fallback=settings.allow_cpu_fallback,
        )

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_at_least(self.spec, batch, self._run)

    def _run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {n: np.ascontiguousarray(batch[n], dtype=dt) for n, dt in self._feeds.items()}
        values = self.session.run(list(self.output_names), feeds)
        out = dict(zip(self.output_names, values, strict=True))
        check_outputs(out, self.output_names, len(batch["input_ids"]))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "providers": self.providers,
            "requested_providers": self.requested or "auto",
            "model_file": self.model_file,
            "intra_op_threads": self.threads,
        }
