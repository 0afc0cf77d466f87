"""TensorRT backend: runs a serialized engine through ``export.trt.runtime.TRTRunner``.

TensorRT needs an NVIDIA GPU, the ``tensorrt`` package and NVIDIA's ``cuda-bindings`` (the runner's
device buffers and stream); without any of them the server refuses to start with one line (exit 2)
instead of a traceback, and so it does for an engine built by another TensorRT release. The engine runs
on CUDA device ``--device-id``; its optimisation profile (sidecar ``trt.min_shape``/``max_shape``) caps
the micro-batcher's batch size and sets the shortest padding. Torch-free: neither this backend nor the
runner imports torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from server.answering.model_spec import ModelSpec
from server.backends.base import Backend, BackendUnavailable, check_outputs, run_at_least
from server.settings import ServerSettings

logger = logging.getLogger(__name__)


def _check_available() -> None:
    """Fail fast with one clear reason: the tensorrt package, cuda-bindings, then a CUDA device."""
    from qa_core.runtime.gpu import gpu_stack_problem

    problem = gpu_stack_problem()
    if problem:
        raise BackendUnavailable(f"--backend trt: {problem}")


class TrtBackend(Backend):
    """One engine and execution context (``TRTRunner`` serialises calls: a context is not thread-safe)."""

    name = "trt"

    @classmethod
    def preflight(cls, settings: ServerSettings) -> None:
        _check_available()

    @classmethod
    def from_settings(cls, spec: ModelSpec, settings: ServerSettings) -> TrtBackend:
        return cls(spec, settings.device_id)

    def __init__(self, spec: ModelSpec, device_id: int = 0) -> None:
        super().__init__(spec)
        _check_available()
        from export.trt.runtime import TRTRunner

        self.device_id = device_id
        try:
            self.runner = TRTRunner(spec.directory, device=device_id)
        except Exception as exc:  # noqa: BLE001 - CUDA/engine errors come in many types; report them in one line
            raise BackendUnavailable(
                f"--backend trt: cannot load the engine in {spec.directory} on CUDA device {device_id}: {exc}"
            ) from None
        logger.info(
            "TensorRT engine loaded from %s on CUDA device %d (%s)",
            spec.directory,
            device_id,
            self.runner.device_name,
        )

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_at_least(self.spec, batch, self._run)

    def _run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raw = self.runner.run(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        out = {n: np.asarray(raw[n]) for n in self.output_names if n in raw}
        check_outputs(out, self.output_names, len(batch["input_ids"]))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "device": "cuda",
            "device_id": self.device_id,
            "gpu": self.runner.device_name,
            "tensorrt": (self.runner.sidecar.trt or {}).get("version"),
            "engine_min_shape": list(self.runner.min_shape),
            "engine_max_shape": list(self.runner.max_shape),
        }

    def close(self) -> None:
        self.runner.close()
