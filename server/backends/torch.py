"""Torch backend: ``QAInference`` (the function that gets exported) under ``inference_mode``.

With ``torch_graphs`` the only modules of the server that import torch, and only when ``--backend torch``
is chosen; eager fp32 is the reference the ONNX/TensorRT backends are checked against. ``--torch-device
cuda[:N]`` runs it on a GPU; a torch that cannot (a CPU wheel, no device, an index past the last GPU)
refuses to start with one line rather than serving from the CPU. ``--torch-dtype fp16|bf16`` casts the
weights; ``--torch-cuda-graphs`` (or ``--torch-compile``: Inductor's fused kernels, recorded the same way) replays
one recorded graph per (batch, length) bucket of the server's batches (:mod:`server.backends.torch_graphs`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from server.answering.model_spec import ModelSpec
from server.backends.base import Backend, BackendUnavailable, batch_limit, check_outputs
from server.backends.buckets import BucketGrid
from server.settings import ServerSettings

if TYPE_CHECKING:
    from train.model.inference import XLNetForQuestionAnswering

logger = logging.getLogger(__name__)


class TorchBackend(Backend):
    """A checkpoint loaded with ``train.model.checkpoint.load`` and wrapped in ``QAInference``."""

    name = "torch"

    @classmethod
    def preflight(cls, settings: ServerSettings) -> None:
        problem = torch_device_problem(settings.torch_device) if settings.torch_device != "cpu" else None
        if problem:
            raise BackendUnavailable(problem)

    @classmethod
    def from_settings(cls, spec: ModelSpec, settings: ServerSettings) -> TorchBackend:
        grid = BucketGrid.for_server(
            batch_limit(spec, settings),
            spec.serving.max_seq_len,
            settings.pad_multiple_of,
            spec.min_engine_seq_len or 1,
        )
        return cls(
            spec,
            settings.backend_threads,
            settings.inter_op_threads,
            settings.torch_device,
            dtype=settings.torch_dtype,
            graphs=settings.torch_graphs,
            grid=grid,
        )

    def __init__(
        self,
        spec: ModelSpec,
        threads: int = 1,
        inter_op_threads: int = 1,
        device: str = "cpu",
        dtype: str = "fp32",
        graphs: str = "off",
        grid: BucketGrid | None = None,
    ) -> None:
        """``graphs``: "off" (eager), "cuda-graphs" or "compile", over ``grid``'s buckets (default: those
        of the server's default batch settings for the model's max_seq_len)."""
        super().__init__(spec)
        try:
            import torch

            import server.backends.torch_graphs as torch_graphs
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
        problem = torch_device_problem(device) or torch_graphs_problem(device, graphs)
        if problem:
            raise BackendUnavailable(problem)
        ckpt = load(spec.directory)
        if ckpt.kind != f"qa:{spec.head}":
            raise BackendUnavailable(
                f"{spec.directory}: checkpoint is {ckpt.kind!r}, the sidecar says qa:{spec.head}"
            )
        model = cast("XLNetForQuestionAnswering", ckpt.model).to(self.device)  # kind is qa:<head>
        # Position tables are made in fp32 on the weights' device, then cast with the weights.
        self.model = QAInference(model).eval().to(torch_graphs.DTYPES[dtype])
        self.dtype = dtype
        self.threads = threads
        self.gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        self.runner: torch_graphs.BucketedRunner | None = None
        if graphs != "off":
            grid = grid or BucketGrid.for_server(
                8, spec.serving.max_seq_len, None, spec.min_engine_seq_len or 1
            )
            capture: torch_graphs.Capture = (
                torch_graphs.CompiledCapture(self.model, self.device, len(grid.buckets()))
                if graphs == "compile"
                else torch_graphs.CudaGraphCapture(self.device)
            )
            self.runner = torch_graphs.BucketedRunner(
                self.model, self.input_names, self.model.names, grid, self.device, capture
            )
        logger.info(
            "torch %s: %s loaded on %s in %s%s, %d intra-op threads",
            torch.__version__,
            ckpt.kind,
            self.gpu or self.device,
            dtype,
            f", {graphs} over {self.runner.grid.batch_sizes} x {self.runner.grid.lengths}"
            if self.runner
            else "",
            threads,
        )

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        # Intra-op thread counts are per calling thread in some builds; re-assert in the worker thread.
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if self.runner is not None:
            out = self.runner.run(batch)
            check_outputs(out, self.output_names, len(batch["input_ids"]))
            return out
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

    def warmup(self, lengths: tuple[int, ...] = (16,), batch_sizes: tuple[int, ...] = (1,)) -> None:
        """With graphs, every bucket is captured first (largest first: one memory pool), so no request
        pays for a capture; then the usual dummy batches."""
        if self.runner is not None:
            self.runner.prepare()
        super().warmup(lengths, batch_sizes)

    def describe(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "backend": self.name,
            "device": str(self.device),
            "dtype": self.dtype,
            "intra_op_threads": self.threads,
        }
        if self.runner is not None:
            facts["graphs"] = self.runner.describe()
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


def torch_graphs_problem(device: str, graphs: str) -> str | None:
    """One line when ``graphs`` (a recorded-graph mode) cannot run on ``device``; None when it can."""
    if graphs == "off" or device.startswith("cuda"):
        return None
    flag = "--torch-compile" if graphs == "compile" else "--torch-cuda-graphs"
    return f"{flag} records CUDA graphs: it needs --torch-device cuda[:N], not {device!r}"
