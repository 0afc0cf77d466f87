"""Fit the answerability model, cross-fitted by article, with scikit-learn (the training side only).

Two stages, each fitted only on questions that nothing it scores was fitted on:

1. **The question verifier** (:data:`~train.squad.answerability_features.QUESTION_FEATURES`): lexical evidence
   that needs no QA model, so it is fitted on the fine-tuning questions themselves (a logistic
   model); its logit is one input of the next stage.
2. **The combining model** on held-out questions the QA model never trained on (a fine-tuning run's
   dev file): the verifier's logit and the QA model's own scores -> logistic model -> calibration
   (Platt or isotonic, scikit-learn's ``CalibratedClassifierCV(ensemble=False)``, whose calibration
   map is learnt on out-of-fold scores) -> decision rule.

Every estimate in the report (ROC AUC, the F1 of each rule, the gain over answering none) comes from
outer folds of whole articles: the combining model, its calibration, its threshold and its span-F1
curve are fitted on the other articles only (with inner folds of their own) and then score the
held-out one. The stored rule is the one with the higher cross-validated F1; when neither beats
answering none, the stored rule answers nothing and the report says so. With fewer than two
articles, folds are paragraphs.

This module chooses and reports; the per-question table and its folds are in
:mod:`.answerability_table`, the scikit-learn fits in :mod:`.answerability_models` and the
rules' cross-fitting in :mod:`.answerability_crossfit`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from train.recipes.answerability_crossfit import (
    CrossFit,
    answers,
    best_threshold,
    cross_fit,
    f1_at,
    fit_rules,
)
from train.recipes.answerability_models import (
    CALIBRATION_METHODS,
    FEATURE_SETS,
    FitOptions,
    answerable_probs,
    as_answerability,
    fit_calibrated,
    fit_question_verifier,
    roc_auc,
)
from train.recipes.answerability_table import Table, build_table, fittable, fold_groups, group_folds
from train.squad import Prediction, SquadExample
from train.squad.answerability import Answerability
from train.squad.answerability_features import VERIFIER_LOGIT
from train.squad.linear import Linear

# The recipe's public names, also those defined beside it (imported from here by the commands,
# the held-out comparison and the tests).
__all__ = [
    "ANSWERABILITY_CHOICES",
    "AUTO_CANDIDATES",
    "CALIBRATION_METHODS",
    "FEATURE_SETS",
    "FitOptions",
    "Table",
    "answerable_probs",
    "answers",
    "as_answerability",
    "best_threshold",
    "build_table",
    "cross_fit",
    "fit_answerability",
    "fit_auto",
    "fit_calibrated",
    "fit_for",
    "fit_question_verifier",
    "fit_rules",
    "group_folds",
    "roc_auc",
]


def fit_answerability(
    examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    opts: FitOptions | None = None,
    verifier: Linear | None = None,
) -> Answerability:
    """The final answerability model for these held-out questions, with its cross-validated report.

    ``verifier`` (the question verifier, fitted elsewhere) is needed when the features include
    ``verifier_logit``. The stored rule is the one with the higher cross-validated F1; when it does
    not beat answering none across the folds, it is a threshold of 0 (never answer).
    """
    opts = opts or FitOptions()
    if VERIFIER_LOGIT in opts.features and verifier is None:
        raise ValueError(f"the features include {VERIFIER_LOGIT}: pass the question verifier")
    t = build_table(examples, predictions, opts.features, verifier)
    if not fittable(t):
        raise ValueError("fitting answerability needs answerable and unanswerable questions in 2+ paragraphs")
    cv = cross_fit(t, opts, verifier)
    none_f1 = float(t.abstain_f1.mean() * 100)
    rule_f1 = {r: float(f1_at(cv.answered[r], t).mean() * 100) for r in opts.rules}
    best_rule = max(opts.rules, key=lambda r: (rule_f1[r], -opts.rules.index(r)))
    beats = rule_f1[best_rule] > none_f1
    per_fold = _per_fold(t, cv, best_rule)
    final = fit_rules(t, replace(opts, rules=(best_rule,)), verifier)[best_rule]
    if not beats:
        final = replace(final, rule="threshold", threshold=0.0)
    report = {
        "features": list(opts.features),
        "fitted_on": {"questions": len(t), "answerable": int(t.answerable.sum()), "grouping": cv.grouping},
        "cv": _cv_report(t, cv, per_fold, rule_f1, none_f1, best_rule),
        "chosen_rule": best_rule,
        "beats_no_answer": beats,
        "decision": (
            f"{best_rule} rule (cross-validated F1 {rule_f1[best_rule]:.2f} vs {none_f1:.2f} answering none)"
            if beats
            else f"answer nothing: no rule beat answering none across the folds "
            f"({rule_f1[best_rule]:.2f} vs {none_f1:.2f})"
        ),
    }
    return replace(final, report=report)


def _per_fold(t: Table, cv: CrossFit, rule: str) -> list[dict[str, Any]]:
    """Each outer fold's groups, size, and F1 under ``rule`` next to answering none."""
    per_fold: list[dict[str, Any]] = []
    for k in range(int(cv.fold_of.max()) + 1):
        rows = np.flatnonzero(cv.fold_of == k)
        sub = t.subset(rows)
        per_fold.append(
            {
                "groups": sorted({str(g) for g in fold_groups(t.articles, t.paragraphs)[0][rows]}),
                "questions": len(rows),
                "f1": float(f1_at(cv.answered[rule][rows], sub).mean() * 100),
                "no_answer_f1": float(sub.abstain_f1.mean() * 100),
            }
        )
    return per_fold


def _cv_report(
    t: Table,
    cv: CrossFit,
    per_fold: list[dict[str, Any]],
    rule_f1: dict[str, float],
    none_f1: float,
    best_rule: str,
) -> dict[str, Any]:
    """What the outer folds say of the chosen rule: F1, gain over answering none and its spread, AUC."""
    gains = [float(f["f1"]) - float(f["no_answer_f1"]) for f in per_fold]
    return {
        "folds": len(per_fold),
        "rule_f1": rule_f1,
        "no_answer_f1": none_f1,
        "f1": rule_f1[best_rule],
        "gain": rule_f1[best_rule] - none_f1,
        "gain_sd_over_folds": float(np.std(gains, ddof=1)) if len(gains) > 1 else None,
        "roc_auc": roc_auc(cv.probs, t.answerable),
        "answered": int(cv.answered[best_rule].sum()),
        "per_fold": per_fold,
    }


AUTO_CANDIDATES = ("verifier-only", "verifier")  # simplest first: it wins ties


def fit_auto(
    examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    verifier: Linear,
    calibration: str = "platt",
    candidates: Sequence[str] = AUTO_CANDIDATES,
) -> Answerability:
    """Each candidate feature set fitted with its own cross-validation; the one with the higher
    cross-validated F1 is kept (the simpler on a tie), and the report lists them all. With little
    calibration data the verifier alone usually wins: the model's scores add variance, not signal."""
    fitted = {
        name: fit_answerability(examples, predictions, FitOptions(FEATURE_SETS[name], calibration), verifier)
        for name in candidates
    }
    best = max(candidates, key=lambda n: (fitted[n].report["cv"]["f1"], -candidates.index(n)))
    report = fitted[best].report | {
        "feature_set": best,
        "candidates": {
            n: {"cv_f1": a.report["cv"]["f1"], "cv_roc_auc": a.report["cv"]["roc_auc"]}
            for n, a in fitted.items()
        },
    }
    return replace(fitted[best], report=report)


# `--answerability` of train.finetune and train.calibrate: a feature set, or auto (see fit_auto).
ANSWERABILITY_CHOICES = ("auto", "verifier", "verifier-only", "model-scores", "cls")


def fit_for(
    choice: str,
    train_examples: Sequence[SquadExample],
    heldout_examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    calibration: str = "platt",
) -> Answerability:
    """The answerability ``choice`` names: the question verifier from the fine-tuning questions, the
    rest cross-fitted on the held-out questions (ValueError when they cannot support a fit)."""
    if choice not in ANSWERABILITY_CHOICES or choice == "cls":
        raise ValueError(f"nothing to fit for --answerability {choice}")
    verifier, verifier_report = None, None
    if choice == "auto" or VERIFIER_LOGIT in FEATURE_SETS[choice]:
        verifier, verifier_report = fit_question_verifier(train_examples)
    if choice == "auto":
        assert verifier is not None
        a = fit_auto(heldout_examples, predictions, verifier, calibration)
    else:
        a = fit_answerability(
            heldout_examples, predictions, FitOptions(FEATURE_SETS[choice], calibration), verifier
        )
    if verifier_report is not None:
        a.report["verifier"] = verifier_report
    return a
