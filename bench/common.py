"""Timing helpers shared by the benchmarks: warm-up, repeated runs, percentiles, Markdown tables."""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np


def time_runs(
    fn: Callable[[], object], *, warmup: int = 3, runs: int = 20, min_seconds: float = 0.0
) -> np.ndarray:
    """Seconds per call over `runs` calls (at least `min_seconds` in total) after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return np.asarray(times)


def pct(times: np.ndarray, q: float) -> float:
    return float(np.percentile(times, q))


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``values`` (NaN for none), for latency lists."""
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=float), q, method="nearest"))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


_SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def cpu_summary() -> str:
    """CPU model, visible cores and the instruction sets int8/bf16 speed depends on (Linux /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    present = [f for f in _SPEED_FLAGS if f in flags] or ["none of " + "/".join(_SPEED_FLAGS)]
    return f"{model}, {os.cpu_count()} cores, flags: {' '.join(present)}"


def machine_line(threads: int) -> str:
    import torch

    parts = [
        cpu_summary(),  # model, cores and the ISA flags int8/bf16 speed depends on
        f"{threads} thread(s) used",
        f"python {platform.python_version()}",
        f"torch {torch.__version__}",
    ]
    try:
        import onnxruntime

        parts.append(f"onnxruntime {onnxruntime.__version__}")
    except ImportError:
        pass
    try:
        import transformers

        parts.append(f"transformers {transformers.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


# The latency tables' reference: every "speed-up vs (a)" divides by this row's time at the same shape
# (HF eager in fp32; its bf16 autocast row is a path of its own).
REFERENCE_PATH = "(a) HF eager"


def counted_flops(module: Callable[..., object], *args: object) -> float:
    """FLOPs of one call as torch counts them while it runs (matrix products, 2 per multiply-add): a
    model's own work, so a rate compares what each path really computes (ours skips the position
    projection with its cached table and computes only the distances each query chunk reads; HF's
    does neither)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from train.model import triton_attention

    # the counter sees aten ops only: the kernel's products are counted as the torch formulation's
    with triton_attention.kernel(False), torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(*args)
    return float(counter.get_total_flops())


_Threads = TypeVar("_Threads", bound="BackgroundThreads")


class BackgroundThreads:
    """Threads running ``target`` until the ``with`` block ends (``self.stopping`` is set then)."""

    def __init__(self, targets: Sequence[Callable[[], None]], join_s: float = 60.0) -> None:
        self.stopping = threading.Event()
        self._threads = [threading.Thread(target=t) for t in targets]
        self._join_s = join_s

    def __enter__(self: _Threads) -> _Threads:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self._threads:
            t.join(self._join_s)
