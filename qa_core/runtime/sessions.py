"""onnxruntime sessions with explicit threads and optimisation level, wrapped as runners (torch-free)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from qa_core.runtime.cores import default_threads
from qa_core.runtime.providers import ProviderEntry, provider_names
from qa_core.runtime.runner import Feeds, Runner
from qa_core.runtime.sidecar import ort_disabled_optimizers

LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session(
    path: str | os.PathLike,
    *,
    threads: int | None = None,
    inter_op_threads: int = 1,
    level: str = "all",
    optimized_path: str | os.PathLike | None = None,
    providers: Sequence[ProviderEntry] = ("CPUExecutionProvider",),
    profile_prefix: str | os.PathLike | None = None,
    spinning: bool = True,
) -> ort.InferenceSession:
    """A session on `path` as every part of the product runs one (exporter, verification, benchmarks,
    the server): explicit threads, sequential execution, the rewrites that hurt on CPU switched off;
    with `optimized_path`, onnxruntime also writes the graph it optimised there. `providers` are names or
    (name, options) pairs (`qa_core.runtime.providers.choose_providers`). With `profile_prefix`,
    onnxruntime's profiler records every node's time (`end_profiling()` writes the JSON). Without
    `spinning`, idle intra-op threads sleep instead of spinning for work (a server's threads share the
    cores with its event loop and tokenizing thread, which the spinning would take between calls)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = inter_op_threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = LEVELS[level]
    options.log_severity_level = 3  # errors only: the fp16 graph's inserted-cast warnings are expected
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    return ort.InferenceSession(
        str(Path(path)),
        options,
        providers=list(providers),
        disabled_optimizers=ort_disabled_optimizers(provider_names(providers)),
        enable_fallback=0,  # a provider that fails raises here; callers decide, never a silent CPU retry
    )


def runner(sess: ort.InferenceSession, output_names: Sequence[str]) -> Runner:
    """feeds -> outputs in `output_names` order (only the inputs the graph declares are fed)."""
    wanted = [i.name for i in sess.get_inputs()]

    def run(feeds: Feeds) -> list[np.ndarray]:
        return sess.run(list(output_names), {k: feeds[k] for k in wanted})

    return run
