"""Offline onnxruntime graph optimisation for the CPU execution provider, and latency measurement.

What pays on this model (CPU EP, one thread, batch 1 x 384, random weights; BENCHMARKS.md has the
tables): MatMuls are ~70% of the time and no graph rewrite removes them. ORT_ENABLE_EXTENDED fuses
Add+Gelu into BiasGelu (LayerNormalization is one op already at opset 17) and constant-folds the shape
arithmetic, but latency stays within noise of the unoptimised export (d_model 256 x 4 layers: 71-78 ms
for every fp32 variant; xlnet-base size: 1.38-1.46 s) and session load barely moves (base: 0.85 -> 0.74 s).
onnxruntime's transformers optimizer adds SkipLayerNormalization but needs ~7 s of symbolic shape
inference and measured no better; its attention fusions do not match XLNet's relative attention. What
does pay on CPU is int8 (`export.onnx.precision`): -18% (small) and -30% (base) latency, 2.4x smaller file.

We stop at ORT_ENABLE_EXTENDED: its graph uses com.microsoft contrib ops that the CPU and CUDA execution
providers both implement, so it stays portable across machines. ORT_ENABLE_ALL adds layout transforms
(NCHWc) specific to the CPU and instruction set it ran on (onnxruntime warns the file must only be used
where it was made); the server's session applies them online at load instead. TensorRT cannot parse
contrib ops at all, so the exporter keeps a standard-ops graph beside it (`Sidecar.portable_model_file`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from export.onnx.graph import op_counts
from qa_core.runtime.runner import Feeds
from qa_core.runtime.sessions import session


def optimize_offline(
    src: str | os.PathLike, dst: str | os.PathLike, *, level: str = "extended", threads: int | None = None
) -> dict[str, Any]:
    """Let onnxruntime optimise `src` at `level` and save the result to `dst`; returns what changed."""
    session(src, threads=threads, level=level, optimized_path=dst)
    before, after = op_counts(onnx.load(str(src))), op_counts(onnx.load(str(dst)))
    fused = {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}
    removed = {op: n - after.get(op, 0) for op, n in before.items() if n > after.get(op, 0)}
    return {
        "level": f"ORT_ENABLE_{level.upper()}",
        "nodes_before": sum(before.values()),
        "nodes_after": sum(after.values()),
        "fused_ops": fused,
        "removed_ops": removed,
    }


def measure_latency(
    path: str | os.PathLike, feeds: Feeds, *, runs: int = 20, level: str = "all", threads: int | None = None
) -> dict[str, Any]:
    """Session load time and per-call latency (median / p90 over `runs` calls after 3 warm-up calls)."""
    start = time.perf_counter()
    sess = session(path, threads=threads, level=level)
    load_s = time.perf_counter() - start
    names = {i.name for i in sess.get_inputs()}
    feed = {k: v for k, v in feeds.items() if k in names}
    for _ in range(3):
        sess.run(None, feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "load_s": round(load_s, 3),
        "median_ms": round(float(np.median(times)), 2),
        "p90_ms": round(float(np.percentile(times, 90)), 2),
        "runs": runs,
        "online_level": f"ORT_{'DISABLE_ALL' if level == 'disable' else 'ENABLE_' + level.upper()}",
        "file": Path(path).name,
    }
