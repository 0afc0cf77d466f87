"""onnxruntime backend: CPU with explicit thread counts, or the CUDA / TensorRT providers on a GPU.

Thread counts are always set explicitly: onnxruntime's default (one thread per core) oversubscribes a
machine that runs several workers or shares its cores. Provider choice, options and the graph file
come from ``export.ort_providers`` (auto = CUDA if available; TensorRT with caches and a profile
covering the server's batches; GPU providers load the portable graph). Which providers a session
really got is read back with ``get_providers()`` and logged, because onnxruntime silently falls back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from server.backends.base import Backend, BackendUnavailable, check_outputs
from server.model_spec import ModelSpec
from server.settings import ServerSettings

logger = logging.getLogger(__name__)

_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def prepare_trt_cache_dir(cache_dir: Path | None, providers: Sequence[str] | None) -> None:
    """Create the TensorRT provider's engine/timing cache directory (no other provider uses it);
    BackendUnavailable naming the flag if it cannot be made."""
    if cache_dir is None or "TensorrtExecutionProvider" not in (providers or []):
        return
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BackendUnavailable(f"--trt-cache-dir {cache_dir}: {exc.strerror or exc}") from None


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
    ) -> None:
        super().__init__(spec)
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendUnavailable(f"--backend onnx needs onnxruntime ({exc})") from None
        from export.ort_providers import ProfileShapes, choose_providers, graph_for, provider_names
        from export.sessions import session
        from train.contract import shortest_sequence

        prepare_trt_cache_dir(trt_cache_dir, providers)
        try:
            wanted = choose_providers(
                ort.get_available_providers(),
                providers,
                profile=ProfileShapes(
                    max_batch=max_batch_size,
                    max_seq_len=spec.max_seq_len,
                    min_seq_len=shortest_sequence(spec.head, spec.start_n_top, spec.end_n_top),
                ),
                trt_cache_dir=trt_cache_dir,
                trt_fp16=trt_fp16,
                device_id=device_id,
                precision=spec.precision,
            )
        except ValueError as exc:
            raise BackendUnavailable(str(exc)) from None
        model_file = graph_for(
            wanted, spec.model_file or "model.onnx", spec.portable_model_file, spec.precision
        )
        model_path = spec.directory / model_file
        if not model_path.is_file():
            raise BackendUnavailable(f"{model_path}: ONNX model file not found")
        self.session = session(
            model_path, threads=threads, inter_op_threads=inter_op_threads, providers=wanted
        )
        self.providers: list[str] = list(self.session.get_providers())
        self.model_file = model_file
        self.threads = threads
        if provider_names(wanted)[0] != self.providers[0]:
            logger.warning("onnxruntime: asked for %s, got %s", provider_names(wanted), self.providers)
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

    @classmethod
    def from_settings(cls, spec: ModelSpec, settings: ServerSettings) -> OnnxBackend:
        return cls(
            spec,
            settings.threads,
            settings.inter_op_threads,
            settings.provider_list(),
            max_batch_size=min(settings.max_batch_size, spec.max_batch_size or settings.max_batch_size),
            trt_cache_dir=settings.trt_cache_dir,
            trt_fp16=settings.trt_fp16,
            device_id=settings.device_id,
        )

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {n: np.ascontiguousarray(batch[n], dtype=dt) for n, dt in self._feeds.items()}
        values = self.session.run(list(self.output_names), feeds)
        out = dict(zip(self.output_names, values, strict=True))
        check_outputs(out, self.output_names, len(batch["input_ids"]))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "providers": self.providers,
            "model_file": self.model_file,
            "intra_op_threads": self.threads,
        }
