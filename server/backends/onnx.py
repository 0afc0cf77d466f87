"""onnxruntime backend: CPU with explicit thread counts, or CUDA/TensorRT providers when available.

Thread counts are always set explicitly: onnxruntime's default (one thread per core) oversubscribes a
machine that runs several workers or shares its cores. Which providers a session really got is read
back with ``get_providers()`` and logged, because onnxruntime silently falls back to CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from server.backends.base import Backend, BackendUnavailable, check_outputs
from server.model_spec import ModelSpec

logger = logging.getLogger(__name__)

_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


def choose_providers(available: list[str], requested: list[str] | None) -> list[str]:
    """Requested providers (all must be available), or the best available: TensorRT > CUDA > CPU."""
    if requested:
        missing = [p for p in requested if p not in available]
        if missing:
            raise BackendUnavailable(
                f"onnxruntime providers {missing} are not available here (have {available})"
            )
        return requested
    order = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    return [p for p in order if p in available] or ["CPUExecutionProvider"]


class OnnxBackend(Backend):
    """One ``InferenceSession`` shared by the inference threads (``run`` is thread-safe in onnxruntime)."""

    name = "onnx"

    def __init__(
        self,
        spec: ModelSpec,
        threads: int = 1,
        inter_op_threads: int = 1,
        providers: list[str] | None = None,
    ) -> None:
        super().__init__(spec)
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendUnavailable(f"--backend onnx needs onnxruntime ({exc})") from None
        model_path = spec.directory / (spec.model_file or "model.onnx")
        if not model_path.is_file():
            raise BackendUnavailable(f"{model_path}: ONNX model file not found")
        from export.sessions import session

        wanted = choose_providers(ort.get_available_providers(), providers)
        self.session = session(
            model_path, threads=threads, inter_op_threads=inter_op_threads, providers=wanted
        )
        self.providers: list[str] = list(self.session.get_providers())
        self.threads = threads
        if wanted[0] != self.providers[0]:
            logger.warning("onnxruntime: asked for %s, got %s", wanted, self.providers)
        logger.info(
            "onnxruntime %s: providers %s, intra-op threads %d", ort.__version__, self.providers, threads
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

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {n: np.ascontiguousarray(batch[n], dtype=dt) for n, dt in self._feeds.items()}
        values = self.session.run(list(self.output_names), feeds)
        out = dict(zip(self.output_names, values, strict=True))
        check_outputs(out, self.output_names, len(batch["input_ids"]))
        return out

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "providers": self.providers, "intra_op_threads": self.threads}
