"""What an ONNX export measures besides its own verification: the graph on other onnxruntime providers
(``--verify-provider``), answer agreement with PyTorch fp32 on SQuAD questions (``--agreement-data``) and
latency (``--benchmark``), each recorded in the export's sidecar; and the record of a verification."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnxruntime

from export.onnx.agreement import agreement
from export.onnx.context import ExportContext
from export.onnx.optimize import measure_latency
from export.onnx.options import MODEL_FILE, PORTABLE_FILE, REFERENCE, VerificationFailed
from export.onnx.torch_export import torch_runner
from export.onnx.verify import DEFAULT_TOLERANCE, Comparison, compare, run_all, sample_batches
from qa_core.runtime.providers import CPU, GPU_PROVIDERS
from qa_core.runtime.sessions import runner, session


def verification_record(result: Comparison, batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A verification as export.json records it."""
    runtime = f"onnxruntime {onnxruntime.__version__} CPUExecutionProvider"
    return {
        **result.record([b["input_ids"].shape for b in batches]),
        "reference": REFERENCE,
        "runtime": runtime,
    }


def verify_on_providers(steps: ExportContext, final: Path, portable: Path | None) -> dict[str, Any]:
    """Verify the graph each provider in ``verify_providers`` would serve (GPU ones: the portable
    graph) on that provider. A session that falls back to another provider is a failure naming the
    cause, not a pass on the CPU; GPU matmuls (TF32) get the fp32 tolerance x 10."""
    from qa_core.runtime.probe import Probe, fallback_problem, preload_gpu_libraries

    results: dict[str, Any] = {}
    for provider in steps.options.verify_providers:
        gpu = provider in GPU_PROVIDERS
        path = (portable or final) if gpu else final
        preload_gpu_libraries([provider])
        entries = [provider, CPU] if provider != CPU else [CPU]
        sess, active, error = None, [CPU], None  # a provider this wheel lacks: onnxruntime uses the CPU
        if provider in onnxruntime.get_available_providers():
            try:
                sess = session(path, threads=steps.threads, providers=entries)
                active = list(sess.get_providers())
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types; the message is the fact
                active, error = [], f"{type(exc).__name__}: {exc}"
        problem = fallback_problem(Probe([provider], active=active, error=error))
        if problem or sess is None:
            raise VerificationFailed(f"--verify-provider {provider}: {problem}")
        tol = DEFAULT_TOLERANCE[steps.options.precision] * (
            10 if gpu and steps.options.precision == "fp32" else 1
        )
        got = run_all(runner(sess, steps.names), steps.batches)
        result = compare(steps.names, steps.reference, got, tol, exact_indices=False, relative=True)
        for line in result.summary(f"verify {path.name} on {provider} (relative tolerance {tol:g}):"):
            steps.report(line)
        if not result.passed:
            raise VerificationFailed(f"{provider}: " + "; ".join(result.problems))
        served = PORTABLE_FILE if path == portable and portable != final else MODEL_FILE
        results[provider] = {"graph": served, **verification_record(result, steps.batches)}
    return results


def agreement_report(steps: ExportContext, final: Path, data: str | os.PathLike[str]) -> None:
    """Decode SQuAD questions with `final` and with PyTorch fp32; record and report how often they agree."""
    rep = agreement(
        str(data),
        steps.tokenizer,
        steps.module.head,
        steps.names,
        torch_runner(steps.module),
        runner(session(final, threads=steps.threads), steps.names),
        steps.settings,
        max_questions=steps.options.agreement_max or None,
        answerability=steps.answerability,
    )
    rep["reference"] = REFERENCE
    steps.record["agreement"] = rep
    diffs = ", ".join(f"{k} {v:.3g}" for k, v in rep["max_abs_diff"].items())
    index = ", ".join(f"{k} {v:.4f}" for k, v in rep["fraction_equal"].items())
    steps.report(
        f"agreement with PyTorch fp32 on {rep['questions']} questions ({rep['features']} windows): identical "
        f"answers {rep['identical_answers']:.4f}, identical best span {rep['identical_best_span']:.4f}, "
        f"same no-answer decision {rep['identical_no_answer_decision']:.4f}; max |diff| {diffs}"
        + (f"; index outputs equal {index}" if index else "")
    )
    either = rep["identical_answers_where_either_answers"]
    steps.report(
        f"either model answers {rep['either_answered']} of them"
        + (f": identical answers there {either:.4f}" if either is not None else ": nothing to compare there")
    )
    steps.report(
        f"best spans: {rep['best_span_changes']} changed, {rep['best_span_changes_at_near_ties']} of them where "
        f"fp32's top two spans are within {rep['near_tie']} of each other; where fp32's lead is larger "
        f"({rep['clear_best_span_questions']} questions) identical {rep['identical_clear_best_span']:.4f}"
    )


def latency_report(steps: ExportContext, final: Path) -> None:
    """Time `benchmark` runs at batch 1 x max_seq_len, exported and final graph, offline and online optimised."""
    runs, t = steps.options.benchmark, steps.settings.max_seq_len
    feeds = sample_batches(steps.tokenizer, [(1, t)], steps.config.vocab_size)[0]
    cases = {
        "exported_no_optimisation": (steps.raw, "disable"),
        "exported_online_all": (steps.raw, "all"),
        "model_offline_only": (final, "disable"),
        "model_online_all": (final, "all"),
    }
    latency = {
        k: measure_latency(p, feeds, runs=runs, level=lv, threads=steps.threads)
        for k, (p, lv) in cases.items()
    }
    steps.record.setdefault("optimization", {})["latency"] = latency
    steps.report(f"latency at batch 1 x {t}, {steps.threads} thread(s), {runs} runs:")
    for name, m in latency.items():
        steps.report(
            f"  {name:26s} median {m['median_ms']:8.2f} ms  p90 {m['p90_ms']:8.2f} ms  load {m['load_s']:.2f} s"
        )
