"""Torch eager backend: ``QAInference`` (the function that gets exported) under ``inference_mode``.

The only module of the server that imports torch, and only when ``--backend torch`` is chosen; it is
the reference the ONNX/TensorRT backends are checked against. ``--torch-device cuda[:N]`` runs it on a
GPU; a torch that cannot (a CPU wheel, no device, an index past the last GPU) refuses to start with one
line rather than serving from the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from server.backends.base import Backend, BackendUnavailable, check_outputs
from server.model_spec import ModelSpec

if TYPE_CHECKING:
    from train.model.inference import XLNetForQuestionAnswering

logger = logging.getLogger(__name__)


class TorchBackend(Backend):
    """A checkpoint loaded with ``train.model.checkpoint.load`` and wrapped in ``QAInference``."""

    name = "torch"

    def __init__(
        self, spec: ModelSpec, threads: int = 1, inter_op_threads: int = 1, device: str = "cpu"
    ) -> None:
        super().__init__(spec)
        try:
            import torch

            from train.model.checkpoint import load
            from train.model.inference import QAInference
        except ImportError as exc:
            raise BackendUnavailable(f"--backend torch needs torch and the train package ({exc})") from None
        self.torch = torch
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(inter_op_threads)
        except RuntimeError:  # only settable before the first parallel work; harmless if already set
            logger.debug("torch inter-op threads already fixed at %d", torch.get_num_interop_threads())
        self.device = torch.device(device)
        problem = torch_device_problem(device)
        if problem:
            raise BackendUnavailable(problem)
        ckpt = load(spec.directory)
        if ckpt.kind != f"qa:{spec.head}":
            raise BackendUnavailable(
                f"{spec.directory}: checkpoint is {ckpt.kind!r}, the sidecar says qa:{spec.head}"
            )
        model = cast("XLNetForQuestionAnswering", ckpt.model).to(self.device)  # kind is qa:<head>
        self.model = QAInference(model).eval()  # its position tables are made on the weights' device
        self.threads = threads
        self.gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        logger.info(
            "torch %s: %s loaded on %s, %d intra-op threads",
            torch.__version__,
            ckpt.kind,
            self.gpu or self.device,
            threads,
        )

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        # Intra-op thread counts are per calling thread in some builds; re-assert in the worker thread.
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        args = [
            torch.from_numpy(np.ascontiguousarray(batch[n], dtype=np.int64)).to(self.device)
            for n in self.input_names
        ]
        with torch.inference_mode():
            values = self.model(*args)
        out = {
            n: v.float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy()
            for n, v in zip(self.model.names, values, strict=True)
        }
        check_outputs(out, self.output_names, len(batch["input_ids"]))
        return out

    def describe(self) -> dict[str, Any]:
        facts = {"backend": self.name, "device": str(self.device), "intra_op_threads": self.threads}
        return facts | ({"gpu": self.gpu} if self.gpu else {})


def torch_device_problem(device: str, flag: str = "--torch-device") -> str | None:
    """One line, naming the command-line ``flag``, when this torch cannot run on ``device`` ("cpu",
    "cuda", "cuda:N"); None when it can."""
    import torch

    try:
        where = torch.device(device)
    except RuntimeError:
        return f"{flag} {device!r}: not a torch device (cpu, cuda or cuda:N)"
    if where.type != "cuda":
        return None
    build = f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none, a CPU wheel'})"
    if not torch.cuda.is_available():
        return f"{flag} {device}: {build} sees no CUDA device"
    index, count = where.index or 0, torch.cuda.device_count()
    if index >= count:
        return f"{flag} {device}: {build} sees {count} CUDA device(s), numbered from 0"
    return None
