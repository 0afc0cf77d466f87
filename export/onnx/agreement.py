"""Does a reduced-precision model give the same answers? Decode SQuAD questions with both and compare.

Both models run over the same features in length-sorted padded batches; outputs are decoded with the
serving decoder (`train.squad`), and we report the fraction of questions whose decided answer text
(after the no-answer threshold) and best span are identical, plus the largest output differences.
Torch-free: the runners are callables from feeds to outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from export.onnx.verify import compare
from qa_core.contract import INPUT_NAMES, ModelSettings
from qa_core.runtime.runner import Runner
from qa_core.squad import (
    Answerability,
    DecodeOptions,
    Feature,
    Prediction,
    decode_all_head_outputs,
    featurize_with,
    pad_batch,
    read_squad,
)

PER_TOKEN = ("start_logits", "end_logits")


def predict_rows(
    run: Runner, names: Sequence[str], features: Sequence[Feature], batch_size: int = 16
) -> dict[str, list[np.ndarray]]:
    """Per-feature output rows (per-token outputs cut to the feature's length), in feature order."""
    rows: dict[str, list[Any]] = {n: [None] * len(features) for n in names}
    order = sorted(range(len(features)), key=lambda i: len(features[i]))
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        arrays = pad_batch([features[i] for i in idx])
        outs = dict(zip(names, run({k: arrays[k] for k in INPUT_NAMES}), strict=True))
        for j, i in enumerate(idx):
            for name in names:
                value = np.asarray(outs[name][j])
                rows[name][i] = value[: len(features[i])] if name in PER_TOKEN else value
    return rows


# Two candidate spans whose decoder scores (start + end logit; log-probabilities for the beam head) differ
# by less than this are a near-tie in the reference itself: any rounding may swap them.
NEAR_TIE = 0.05


def best_span_margin(prediction: Prediction) -> float:
    """Score gap between the best span and the best span with a different text (inf when there is none)."""
    if not prediction.n_best:
        return float("inf")
    top = prediction.n_best[0]
    rival = next((e for e in prediction.n_best[1:] if e.text != top.text), None)
    return float("inf") if rival is None else top.score - rival.score


def compare_predictions(
    names: Sequence[str],
    ref_rows: dict[str, list[np.ndarray]],
    got_rows: dict[str, list[np.ndarray]],
    ref_preds: dict[str, Prediction],
    got_preds: dict[str, Prediction],
) -> dict[str, Any]:
    n = len(ref_preds)
    same_text = sum(ref_preds[q].text == got_preds[q].text for q in ref_preds)
    same_span = sum(ref_preds[q].best_span_text == got_preds[q].best_span_text for q in ref_preds)
    same_decision = sum(ref_preds[q].is_impossible == got_preds[q].is_impossible for q in ref_preds)
    either = [q for q in ref_preds if ref_preds[q].text or got_preds[q].text]
    same_either = sum(ref_preds[q].text == got_preds[q].text for q in either)
    margins = {q: best_span_margin(p) for q, p in ref_preds.items()}
    changed = [q for q in ref_preds if ref_preds[q].best_span_text != got_preds[q].best_span_text]
    clear = [q for q in ref_preds if margins[q] >= NEAR_TIE]
    clear_same = sum(ref_preds[q].best_span_text == got_preds[q].best_span_text for q in clear)

    def batches(rows: dict[str, list[np.ndarray]]) -> list[list[np.ndarray]]:
        return [[np.asarray(rows[name][i])[None] for name in names] for i in range(len(rows[names[0]]))]

    outputs = compare(
        names, batches(ref_rows), batches(got_rows), tolerance=float("inf"), exact_indices=False
    )
    return {
        "questions": n,
        # How many questions the reference answers (an agreement on "" everywhere proves little).
        "reference_answered": sum(bool(p.text) for p in ref_preds.values()),
        "identical_answers": same_text / n if n else 1.0,
        "identical_best_span": same_span / n if n else 1.0,
        "identical_no_answer_decision": same_decision / n if n else 1.0,
        # Where either model answers: the agreement that a rule answering (almost) nothing cannot inflate.
        "either_answered": len(either),
        "identical_answers_where_either_answers": same_either / len(either) if either else None,
        # Where the reference's best span leads its runner-up by >= NEAR_TIE, and how many of the changed
        # best spans were near-ties of the reference (a weakly trained model has many).
        "near_tie": NEAR_TIE,
        "clear_best_span_questions": len(clear),
        "identical_clear_best_span": clear_same / len(clear) if clear else 1.0,
        "best_span_changes": len(changed),
        "best_span_changes_at_near_ties": sum(margins[q] < NEAR_TIE for q in changed),
        "max_abs_diff": outputs.max_abs_diff,
        "fraction_equal": outputs.fraction_equal,
    }


def agreement(
    data_file: str,
    tokenizer,
    head: str,
    names: Sequence[str],
    reference: Runner,
    candidate: Runner,
    settings: ModelSettings,
    *,
    max_questions: int | None = None,
    batch_size: int = 16,
    answerability: Answerability | None = None,
) -> dict[str, Any]:
    """Agreement of `candidate` with `reference` on the first `max_questions` questions of a SQuAD file,
    both decided by the model's ``answerability`` (default: its no-answer threshold on sigmoid(cls))."""
    examples = read_squad(data_file)[: max_questions or None]
    if not examples:
        raise ValueError(f"{data_file}: no questions")
    model = settings
    features = featurize_with(examples, tokenizer, model)
    ref_rows = predict_rows(reference, names, features, batch_size)
    got_rows = predict_rows(candidate, names, features, batch_size)
    options = DecodeOptions.of(model, answerability or Answerability.cls_only(model.no_answer_threshold))
    ref_preds = decode_all_head_outputs(head, examples, features, ref_rows, options)
    got_preds = decode_all_head_outputs(head, examples, features, got_rows, options)
    report = compare_predictions(names, ref_rows, got_rows, ref_preds, got_preds)
    report.update({"data": str(data_file), "features": len(features)})
    return report
