"""The answerability's decision rules scored honestly: thresholds chosen on out-of-fold probabilities,
and outer folds of whole articles in which everything is fitted on the other folds first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from qa_core.squad.answerability import Answerability
from qa_core.squad.answerability_params import Linear
from train.answerability.estimators import (
    FitOptions,
    answerable_probs,
    as_answerability,
    fit_calibrated,
    fit_span_f1,
    out_of_fold_probs,
)
from train.answerability.table import Table, fittable, table_folds


def answers(a: Answerability, t: Table) -> np.ndarray:
    """True where the rule answers: :meth:`Answerability.decision` on every row, the function the
    server decides with (a question without a span is never answered)."""
    rows = t.rows(a.features)
    return np.array([not a.decision(r, bool(s)).is_impossible for r, s in zip(rows, t.has_span, strict=True)])


def f1_at(answered: np.ndarray, t: Table) -> np.ndarray:
    """Per-question F1 of answering where ``answered`` holds and abstaining elsewhere."""
    return np.where(answered, t.answer_f1, t.abstain_f1)


def best_threshold(probs: np.ndarray, t: Table) -> float:
    """The threshold on 1 - P(answerable) with the highest F1 on these rows (0: answer nothing):
    the official sweep, answering in order of confidence and keeping the best running total."""
    no_answer = 1.0 - probs
    order = np.argsort(no_answer, kind="stable")
    gains = np.where(t.has_span[order], t.answer_f1[order] - t.abstain_f1[order], 0.0)
    running = np.cumsum(gains)
    if running.size == 0 or running.max() <= 0:
        return 0.0
    return float(no_answer[order][int(np.argmax(running))])


def fit_rules(t: Table, opts: FitOptions, verifier: Linear | None) -> dict[str, Answerability]:
    """Everything fitted on ``t`` alone, under each rule of ``opts``: the threshold chosen on inner
    out-of-fold probabilities, the span-F1 model on the answerable rows (out of fold too)."""
    model = fit_calibrated(t, opts)
    a = as_answerability(model, opts, verifier)
    out: dict[str, Answerability] = {}
    for rule in opts.rules:
        if rule == "expected_gain":
            out[rule] = replace(a, rule="expected_gain", span_f1=fit_span_f1(t))
        else:
            threshold = best_threshold(out_of_fold_probs(model, t, opts), t)
            out[rule] = replace(a, rule="threshold", threshold=threshold)
    return out


@dataclass
class CrossFit:
    """Out-of-fold results: for each row, what was fitted without its fold said."""

    probs: np.ndarray
    answered: dict[str, np.ndarray]  # rule -> answered
    fold_of: np.ndarray
    grouping: str


def cross_fit(t: Table, opts: FitOptions, verifier: Linear | None = None) -> CrossFit:
    """Outer folds of whole groups: everything is fitted on the other folds, then scores this one."""
    held_out, grouping = table_folds(t)
    probs = np.full(len(t), np.nan)
    answered = {r: np.zeros(len(t), dtype=bool) for r in opts.rules}
    fold_of = np.zeros(len(t), dtype=int)
    for k, held in enumerate(held_out):
        fold_of[held] = k
        train, test = t.subset(np.setdiff1d(np.arange(len(t)), held)), t.subset(held)
        if not fittable(train):
            probs[held] = train.answerable.mean()  # nothing to fit: the base rate, and no answers
            continue
        fitted = fit_rules(train, opts, verifier)
        p = answerable_probs(next(iter(fitted.values())), test)  # one calibrated model under every rule
        probs[held] = p
        for rule, a in fitted.items():
            answered[rule][held] = answers(a, test)
    return CrossFit(probs, answered, fold_of, grouping)
