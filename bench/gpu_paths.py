"""The GPU paths of ``bench.latency``: ours with recorded graphs (g) and our export on onnxruntime's CUDA
provider (h). Each returns a ``make(feeds) -> run`` as the other paths do, or raises :class:`Skipped`
with the reason (printed and kept in the JSON).

(g) uses the server's own bucketed runner (``server.backends.torch_graphs``) with one bucket of exactly
the measured shape, and times the replay alone (inputs already in its static buffers, outputs left on
the device, then a synchronize), as (a) and (c) time their kernels; "eager" beside it is the same cast
model without a graph, so the graph's own gain is the ratio of the two. On a CPU the capture is the
eager "replay" stand-in: a dry run of the code path, not a measurement of graphs.
(h) is the server's ONNX backend asked for the CUDA provider (the portable graph, strict: a session
that falls back to the CPU is a skip), timed through ``Backend.run`` (numpy in and out, as served).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from qa_core.contract import INPUT_NAMES
from server.backends.buckets import Bucket, BucketGrid
from server.backends.torch_graphs import DTYPES, BucketedRunner, Capture, CudaGraphCapture, EagerReplay
from train.model import triton_attention

Feeds = dict[str, np.ndarray]
Make = Callable[[Feeds], Callable[[], object]]


class Skipped(RuntimeError):
    """This path cannot run here; the message says why."""


def cast_model(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """A copy of ``model`` in ``dtype`` (the original stays fp32 for the other paths)."""
    return copy.deepcopy(model).to(DTYPES[dtype]).eval()


def eager_runner(model: torch.nn.Module, device: torch.device) -> Make:
    """``model`` on device tensors, synchronized: the eager baseline of a cast model."""

    def make(feeds: Feeds) -> Callable[[], object]:
        tensors = [torch.from_numpy(feeds[n]).to(device) for n in INPUT_NAMES]

        def run() -> object:
            with torch.inference_mode():
                out = model(*tensors)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return out

        return run

    return make


def one_bucket_runner(model: torch.nn.Module, device: torch.device, rows: int, length: int) -> BucketedRunner:
    """The server's bucketed runner with one bucket, ``rows`` x ``length``, captured now (a CUDA graph on
    CUDA, the eager stand-in elsewhere)."""
    capture: Capture = CudaGraphCapture(device) if device.type == "cuda" else EagerReplay()
    names = getattr(model, "names", ())
    runner = BucketedRunner(model, INPUT_NAMES, names, BucketGrid((rows,), (length,)), device, capture)
    runner.prepare()
    return runner


def graph_runner(model: torch.nn.Module, device: torch.device, attention_kernel: bool = True) -> Make:
    """One bucket of the measured shape, captured (a CUDA graph on CUDA, the eager stand-in elsewhere),
    its inputs filled once; the run is the replay. ``attention_kernel=False`` captures the torch
    formulation of the attention where the Triton kernel would run (the kernel's own gain, side by side)."""

    def make(feeds: Feeds) -> Callable[[], object]:
        rows, length = feeds["input_ids"].shape
        with triton_attention.kernel(attention_kernel):
            runner = one_bucket_runner(model, device, rows, length)
        slot = runner.slots[Bucket(rows, length)]
        slot.load(feeds)

        def run() -> object:
            slot.replay()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return slot.outputs

        return run

    return make


def served_graph_runner(model: torch.nn.Module, device: torch.device) -> Make:
    """The same bucket as :func:`graph_runner`, timed as the server calls it: ``BucketedRunner.run`` on
    numpy windows (the copies into the static buffers, the casts and the copies back included)."""

    def make(feeds: Feeds) -> Callable[[], object]:
        runner = one_bucket_runner(model, device, *feeds["input_ids"].shape)
        return lambda: runner.run(feeds)

    return make


def ort_bound_runner(export_dir: Path, device: torch.device, cuda_graph: bool) -> Make:
    """Our portable export on onnxruntime with IO binding: inputs copied to the device once, outputs
    written into buffers bound there (nothing crosses to the host per run), optionally replayed as
    onnxruntime's own CUDA graph (``enable_cuda_graph``: one session per shape, captured at its first
    run). On a CPU, the IO-binding code path on the CPU provider (a dry run; no graph)."""
    import onnxruntime as ort

    from qa_core.runtime.providers import CUDA
    from qa_core.runtime.sessions import session
    from qa_core.runtime.sidecar import Sidecar

    side = Sidecar.load(export_dir)
    graph = export_dir / (side.portable_model_file or side.model_file)
    on_gpu = device.type == "cuda"
    if cuda_graph and not on_gpu:
        raise Skipped("onnxruntime's CUDA graphs need a CUDA device")
    where, index = ("cuda", device.index or 0) if on_gpu else ("cpu", 0)
    options = {"device_id": str(index), "enable_cuda_graph": "1" if cuda_graph else "0"}
    providers = [(CUDA, options)] if on_gpu else ["CPUExecutionProvider"]

    def make(feeds: Feeds) -> Callable[[], object]:
        try:
            sess = session(graph, providers=providers)
        except Exception as exc:  # a provider that cannot load says why; the row is skipped with it
            raise Skipped(f"onnxruntime session on {providers}: {exc}") from None
        inputs = {n: ort.OrtValue.ortvalue_from_numpy(feeds[n], where, index) for n in INPUT_NAMES}
        # The outputs' shapes and types at this input shape, from a session without a graph to capture
        # (a graph session's first run would record host buffers).
        shaper = session(graph, providers=[(CUDA, {"device_id": str(index)})] if on_gpu else providers)
        plain = shaper.run(None, feeds)
        del shaper
        names = [o.name for o in sess.get_outputs()]
        outputs = {
            n: ort.OrtValue.ortvalue_from_shape_and_type(list(out.shape), out.dtype, where, index)
            for n, out in zip(names, plain, strict=True)
        }
        binding = sess.io_binding()
        for n, value in inputs.items():
            binding.bind_ortvalue_input(n, value)
        for n, value in outputs.items():
            binding.bind_ortvalue_output(n, value)

        def run() -> object:
            sess.run_with_iobinding(binding)
            binding.synchronize_outputs()
            return outputs

        run()  # with a CUDA graph: the capture, not a measured run
        return run

    return make


def ort_cuda_runner(export_dir: Path, device_id: int = 0) -> Make:
    """Our export served by the server's ONNX backend on the CUDA provider; Skipped if it does not run."""
    from qa_core.runtime.providers import CUDA
    from server.answering.model_spec import resolve_spec
    from server.backends import BackendUnavailable
    from server.backends.onnx import OnnxBackend

    spec = resolve_spec(export_dir, "onnx")
    try:
        backend = OnnxBackend(spec, providers=[CUDA], device_id=device_id, max_batch_size=64)
    except BackendUnavailable as exc:
        raise Skipped(str(exc)) from None
    return lambda feeds: lambda: backend.run(feeds)
