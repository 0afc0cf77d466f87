"""The torch backend's low-latency path: one static shape per bucket, replayed instead of re-launched.

Eager torch launches every kernel of every layer from Python on each call; at batch 1 on a GPU that
launch cost, not the maths, is the latency. A CUDA graph records one call's kernels once and replays
them with a single launch, but only on the tensors it was recorded with: so each bucket of
:mod:`server.backends.buckets` owns static input buffers, a batch is copied into its bucket's buffers
(padding the rest exactly as ``qa_core.squad.pad_batch`` pads), the graph is replayed, and the outputs
are cut back to the batch's rows and tokens. Padding rows and columns cannot change the real ones
(attention masks them; rows never mix), and the outputs of one call are read before the next replay.

How a bucket is made is a :class:`Capture`:

- :class:`CudaGraphCapture`: ``torch.cuda.CUDAGraph``, after warm-up runs on a side stream (cuBLAS
  handles and workspaces are created outside the graph), every graph in one memory pool, largest
  bucket first so the smaller ones reuse its memory;
- :class:`CompiledCapture`: ``torch.compile`` (Inductor's fused kernels around the matrix products and
  the attention kernel), compiled once per bucket and recorded as :class:`CudaGraphCapture` records;
- :class:`EagerReplay`: no recording: "replay" runs the model eagerly on the static buffers. The
  bucketing, buffer and padding logic is the same, which is how it is tested on a CPU.

A batch larger than every bucket runs eagerly (logged once). One lock serializes runs: the buffers and
the graphs' memory are shared, and a GPU runs one graph at a time anyway.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from qa_core.contract import CLS_ID, SEG_ID_CLS
from server.backends.base import PAD_VALUES, cut_tokens
from server.backends.buckets import Bucket, BucketGrid

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
WARMUP_RUNS = 3  # before a capture: lazy cuBLAS/cuDNN set-up must not happen inside the graph
# A padding row is a one-token window, "<cls>": every row then has a key to attend to.
ROW_PAD_FIRST = {"input_ids": CLS_ID, "attention_mask": 1, "token_type_ids": SEG_ID_CLS}

Model = Callable[..., Sequence[torch.Tensor]]


@dataclass
class StaticSlot:
    """One bucket's static inputs (in the model's argument order), its outputs and how to refresh them.

    A batch crosses to the device and back in one copy each way per tensor, without a wait between:
    it is padded into ``staging`` (host memory, page-locked on a GPU: [inputs, B, T] int64, so one
    copy moves every input), copied to ``device_inputs`` (of which ``inputs`` are views) without
    blocking, replayed, and each output copied into its page-locked twin in ``host_outputs``, then one
    synchronize. (Per input and per output, pageable copies each wait for the device: ~0.3 ms of a
    1.3 ms H200 call at 1x384.)"""

    bucket: Bucket
    inputs: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, ...]
    replay: Callable[[], None]
    staging: torch.Tensor
    device_inputs: torch.Tensor
    host_outputs: tuple[torch.Tensor, ...]

    def load(self, batch: Mapping[str, np.ndarray]) -> None:
        """Pad ``batch`` into the staging buffer (:func:`pad_into`) and start its copy to the device."""
        pad_into(self.staging.numpy(), list(self.inputs), batch)
        self.device_inputs.copy_(self.staging, non_blocking=True)

    def read(self, names: Sequence[str], rows: int, length: int) -> dict[str, np.ndarray]:
        """The outputs of the last replay, cut to ``rows`` x ``length`` (host copies of their own)."""
        for host, value in zip(self.host_outputs, self.outputs, strict=True):
            host.copy_(value, non_blocking=True)
        if self.outputs and self.outputs[0].is_cuda:
            torch.cuda.current_stream(self.outputs[0].device).synchronize()
        kept = {name: host.numpy()[:rows] for name, host in zip(names, self.host_outputs, strict=True)}
        return {name: np.array(value) for name, value in cut_tokens(kept, length).items()}


class Capture(abc.ABC):
    """Makes a bucket's outputs a function of its static inputs, refreshed by ``replay()``."""

    name = "capture"

    @abc.abstractmethod
    def __call__(
        self, model: Model, inputs: Sequence[torch.Tensor]
    ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        """``(static outputs, replay)`` for ``model`` on ``inputs`` (already filled with a valid batch)."""


class EagerReplay(Capture):
    """No recording: each replay runs the model on the static inputs and copies into static outputs."""

    name = "eager"

    def __call__(
        self, model: Model, inputs: Sequence[torch.Tensor]
    ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        with torch.inference_mode():
            outputs = tuple(o.clone() for o in model(*inputs))

        def replay() -> None:
            with torch.inference_mode():
                for static, fresh in zip(outputs, model(*inputs), strict=True):
                    static.copy_(fresh)

        return outputs, replay


class CudaGraphCapture(Capture):
    """``torch.cuda.CUDAGraph`` per bucket, all in one memory pool."""

    name = "cuda-graphs"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: list[torch.cuda.CUDAGraph] = []  # kept alive with their slots

    def __call__(
        self, model: Model, inputs: Sequence[torch.Tensor]
    ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.inference_mode():
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    model(*inputs)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = tuple(model(*inputs))
        self.graphs.append(graph)
        return outputs, graph.replay


class CompiledCapture(CudaGraphCapture):
    """``torch.compile`` (Inductor: the projections' bias and GELU, residual + LayerNorm and the masks'
    element-wise work fused into the kernels around the matrix products, the Triton attention kernel
    kept as one operator), compiled once per bucket's shape and recorded into this server's own CUDA
    graphs, in the one pool, like :class:`CudaGraphCapture`: replayed from any thread, with no copy of
    the outputs (torch's own "reduce-overhead" graphs are per thread and overwrite their outputs)."""

    name = "compile"

    def __init__(
        self, model: nn.Module, device: torch.device, buckets: int = 64, mode: str | None = None
    ) -> None:
        """``mode``: torch.compile's (None: its default; "max-autotune-no-cudagraphs" also times GEMM
        templates per shape, minutes per bucket)."""
        super().__init__(device)
        import torch._dynamo

        # One compiled graph per bucket shape; past dynamo's default limit (8) a new shape would run eagerly.
        limit = max(buckets + 1, 8)
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), limit))
        self.compiled = torch.compile(model, dynamic=False, mode=mode)

    def __call__(
        self, model: Model, inputs: Sequence[torch.Tensor]
    ) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        # compiled once for every bucket (its own wrapper from the runner is ignored); the cast to float32
        # stays outside the compiled graph, inside the recorded one
        return super().__call__(float_outputs(self.compiled), inputs)


class BucketedRunner:
    """Runs padded numpy batches through per-bucket static buffers (see the module docstring)."""

    def __init__(
        self,
        model: Model,
        input_names: Sequence[str],
        output_names: Sequence[str],
        grid: BucketGrid,
        device: torch.device,
        capture: Capture,
    ) -> None:
        self.model = model
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.grid = grid
        self.device = device
        self.capture = capture
        self.slots: dict[Bucket, StaticSlot] = {}
        self.eager_calls = 0
        self._lock = threading.Lock()
        self._told_eager = False

    def prepare(self, buckets: Sequence[Bucket] | None = None) -> None:
        """Capture ``buckets`` (default: all, largest first) now rather than at their first batch."""
        with self._lock:
            for bucket in buckets if buckets is not None else self.grid.buckets():
                self._slot(bucket)

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, length = batch[self.input_names[0]].shape
        bucket = self.grid.choose(rows, length)
        if bucket is None:
            return self._eager(batch)
        with self._lock:
            slot = self._slot(bucket)
            slot.load(batch)
            slot.replay()
            return slot.read(self.output_names, rows, length)

    def describe(self) -> dict[str, Any]:
        largest = self.grid.largest
        return {
            "capture": self.capture.name,
            "buckets": len(self.grid.batch_sizes) * len(self.grid.lengths),
            "captured": len(self.slots),
            "largest_bucket": f"{largest.batch}x{largest.length}",
            "eager_calls": self.eager_calls,
        }

    def _slot(self, bucket: Bucket) -> StaticSlot:
        """The bucket's slot, captured on first use (the caller holds the lock)."""
        slot = self.slots.get(bucket)
        if slot is None:
            shape = (len(self.input_names), bucket.batch, bucket.length)
            pinned = self.device.type == "cuda"
            staging = torch.empty(shape, dtype=torch.int64, pin_memory=pinned)
            device_inputs = torch.empty(shape, dtype=torch.int64, device=self.device)
            inputs = {name: device_inputs[k] for k, name in enumerate(self.input_names)}
            pad_into(
                staging.numpy(), self.input_names, None
            )  # all padding rows: a valid batch to record with
            device_inputs.copy_(staging)
            outputs, replay = self.capture(float_outputs(self.model), list(inputs.values()))
            host_outputs = tuple(torch.empty(o.shape, dtype=o.dtype, pin_memory=pinned) for o in outputs)
            slot = StaticSlot(bucket, inputs, outputs, replay, staging, device_inputs, host_outputs)
            self.slots[bucket] = slot
            logger.debug("torch %s: bucket %dx%d ready", self.capture.name, bucket.batch, bucket.length)
        return slot

    def _eager(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, length = batch[self.input_names[0]].shape
        if not self._told_eager:
            self._told_eager = True
            largest = self.grid.largest
            logger.warning(
                "torch %s: a batch of %dx%d is beyond every bucket (up to %dx%d): such batches run eagerly "
                "(logged once)",
                self.capture.name,
                rows,
                length,
                largest.batch,
                largest.length,
            )
        self.eager_calls += 1
        args = [
            torch.from_numpy(np.ascontiguousarray(batch[n], dtype=np.int64)).to(self.device)
            for n in self.input_names
        ]
        with torch.inference_mode():
            values = self.model(*args)
        return {name: to_numpy(v) for name, v in zip(self.output_names, values, strict=True)}


def pad_into(host: np.ndarray, names: Sequence[str], batch: Mapping[str, np.ndarray] | None) -> None:
    """Write ``batch`` into the top-left of ``host`` ([inputs, B, T], in ``names``' order); the columns
    past its tokens get pad_batch's padding, the rows past its rows become one-token ``<cls>`` windows
    (``None``: every row)."""
    for k, name in enumerate(names):
        rows, length = (0, 0) if batch is None else batch[name].shape
        if batch is not None:
            host[k, :rows, :length] = batch[name]
            host[k, :rows, length:] = PAD_VALUES[name]
        host[k, rows:] = PAD_VALUES[name]
        host[k, rows:, 0] = ROW_PAD_FIRST[name]


def float_outputs(model: Model) -> Model:
    """``model`` with half-precision outputs widened to float32 (what the decoder and the other backends
    read), inside the recorded graph rather than as a kernel of its own per read."""

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(o.float() if o.is_floating_point() else o for o in model(*inputs))

    return run


def to_numpy(value: torch.Tensor) -> np.ndarray:
    """Host copy; half-precision floats come back as float32 (what the decoder and the other backends use)."""
    return value.float().cpu().numpy() if value.is_floating_point() else value.cpu().numpy()
