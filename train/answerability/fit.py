"""Fit the answerability model, cross-fitted by article, with scikit-learn (the training side only).

Two stages, each fitted only on questions that nothing it scores was fitted on:

1. **The question verifier** (:data:`~qa_core.squad.answerability_features.QUESTION_FEATURES`): lexical evidence
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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from qa_core.squad import Prediction, SquadExample
from qa_core.squad.answerability import NONE_RULE, Answerability
from qa_core.squad.answerability_features import VERIFIER_LOGIT
from qa_core.squad.answerability_params import Linear
from train.answerability.crossfit import (
    CrossFit,
    answers,
    best_threshold,
    cross_fit,
    f1_at,
    fit_rules,
)
from train.answerability.estimators import (
    CALIBRATION_METHODS,
    FEATURE_SETS,
    FitOptions,
    answerable_probs,
    as_answerability,
    fit_calibrated,
    fit_question_verifier,
    roc_auc,
)
from train.answerability.rerank_fit import fit_reranker, reranked
from train.answerability.table import (
    Table,
    build_table,
    fittable,
    fold_groups,
    group_folds,
    table_folds,
)

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
    "fit_table",
    "nested_gains",
    "credible_lower_bound",
    "choose",
    "fit_for",
    "fit_question_verifier",
    "fit_rules",
    "group_folds",
    "roc_auc",
]


@dataclass(frozen=True)
class Choice:
    """A feature set's options and one of its rules, with the F1 its cross-validation gave."""

    opts: FitOptions
    rule: str
    cv: CrossFit
    f1: float


def choose(t: Table, candidates: Sequence[FitOptions], verifier: Linear | None) -> Choice:
    """The (feature set, rule) with the highest cross-validated F1 on ``t``; earlier candidates and
    rules win ties (list the simpler first)."""
    best: Choice | None = None
    for opts in candidates:
        cv = cross_fit(t, opts, verifier)
        for rule in opts.rules:
            f1 = float(f1_at(cv.answered[rule], t).mean() * 100)
            if best is None or f1 > best.f1:
                best = Choice(opts, rule, cv, f1)
    assert best is not None
    return best


@dataclass(frozen=True)
class Nested:
    """The whole choice judged on groups it never saw: per outer group (article), the gain over
    answering none of what was chosen and fitted on the other groups."""

    groups: list[str]
    questions: list[int]
    gains: list[float]  # F1 points over answering none, per group
    answered: int
    grouping: str

    @property
    def mean_gain(self) -> float:
        return float(np.average(self.gains, weights=self.questions)) if self.gains else 0.0

    @property
    def lower_bound(self) -> float:
        return credible_lower_bound(self.gains, self.questions)


def nested_gains(t: Table, candidates: Sequence[FitOptions], verifier: Linear | None) -> Nested:
    """Outer folds of whole groups; in each, :func:`choose` runs on the other groups alone (the
    choice among feature sets and rules is part of what is judged), the choice is fitted there, and
    each held-out group's gain is measured."""
    held_out, grouping = table_folds(t)
    groups, _ = fold_groups(t.articles, t.paragraphs)
    names, sizes, gains, answered = [], [], [], 0
    for held in held_out:
        train = t.subset(np.setdiff1d(np.arange(len(t)), held))
        test = t.subset(held)
        said = np.zeros(len(test), dtype=bool)
        if fittable(train):
            choice = choose(train, candidates, verifier)
            fitted = fit_rules(train, replace(choice.opts, rules=(choice.rule,)), verifier)[choice.rule]
            said = answers(fitted, test)
        answered += int(said.sum())
        f1 = f1_at(said, test)
        for g in sorted(set(groups[held].tolist()), key=str):
            rows = groups[held] == g
            names.append(str(g))
            sizes.append(int(rows.sum()))
            gains.append(float((f1[rows] - test.abstain_f1[rows]).mean() * 100))
    return Nested(names, sizes, gains, answered, grouping)


def credible_lower_bound(gains: Sequence[float], weights: Sequence[float], level: float = 0.95) -> float:
    """One-sided ``level`` lower bound of the question-weighted mean gain, groups as the unit: the
    weighted mean minus Student's t (groups - 1 degrees of freedom) times the groups' standard error.
    Questions of one article move together, so the article is what is sampled; with one group there
    is no bound (-inf)."""
    from scipy.stats import t as student

    d, w = np.asarray(gains, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    m = d.size
    if m < 2 or w.sum() <= 0:
        return float("-inf")
    w = w / w.sum()
    mean = float(np.dot(w, d))
    se = float(np.sqrt(m / (m - 1) * np.sum(w**2 * (d - mean) ** 2)))
    return mean - float(student.ppf(level, m - 1)) * se


def fit_answerability(
    examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    opts: FitOptions | Sequence[FitOptions] | None = None,
    verifier: Linear | None = None,
) -> Answerability:
    """The final answerability model for these held-out questions, with its cross-validated report.

    ``opts``: one feature set, or several candidates to choose among (the simpler first). The
    (feature set, rule) with the higher cross-validated F1 is fitted on every question; it is kept
    only when the guard holds: the gain over answering none of the *whole choice*, judged by nested
    cross-validation over articles, has a one-sided 95% lower bound above 0 (:func:`nested_gains`,
    :func:`credible_lower_bound`). Otherwise the stored rule is ``none``: it never answers.
    ``verifier`` (the question verifier, fitted elsewhere) is needed when the features include
    ``verifier_logit``.
    """
    candidates = [opts or FitOptions()] if opts is None or isinstance(opts, FitOptions) else list(opts)
    if any(VERIFIER_LOGIT in o.features for o in candidates) and verifier is None:
        raise ValueError(f"the features include {VERIFIER_LOGIT}: pass the question verifier")
    features = tuple(dict.fromkeys(f for o in candidates for f in o.features))
    return fit_table(build_table(examples, predictions, features, verifier), candidates, verifier)


def fit_table(t: Table, candidates: Sequence[FitOptions], verifier: Linear | None) -> Answerability:
    """:func:`fit_answerability` on a table already built (its columns hold every candidate's features)."""
    if not fittable(t):
        raise ValueError("fitting answerability needs answerable and unanswerable questions in 2+ paragraphs")
    choice = choose(t, candidates, verifier)
    nested = nested_gains(t, candidates, verifier)
    credible = nested.lower_bound > 0
    none_f1 = float(t.abstain_f1.mean() * 100)
    final = fit_rules(t, replace(choice.opts, rules=(choice.rule,)), verifier)[choice.rule]
    if not credible:
        final = replace(final, rule=NONE_RULE)
    rule_f1 = {r: float(f1_at(choice.cv.answered[r], t).mean() * 100) for r in choice.opts.rules}
    per_fold = _per_fold(t, choice.cv, choice.rule)
    report = {
        "features": list(choice.opts.features),
        "fitted_on": {
            "questions": len(t),
            "answerable": int(t.answerable.sum()),
            "grouping": choice.cv.grouping,
            "articles": sorted(set(t.articles.tolist())),
        },
        "cv": _cv_report(t, choice.cv, per_fold, rule_f1, none_f1, choice.rule),
        "chosen_rule": choice.rule,
        "nested": {
            "grouping": nested.grouping,
            "per_group": sorted(
                (
                    {"group": g, "questions": n, "gain": d}
                    for g, n, d in zip(nested.groups, nested.questions, nested.gains, strict=True)
                ),
                key=lambda row: str(row["group"]),
            ),
            "mean_gain": nested.mean_gain,
            "lower_bound": nested.lower_bound if np.isfinite(nested.lower_bound) else None,
            "answered": nested.answered,
        },
        "beats_no_answer": credible,
        "decision": _decision_text(choice, nested, none_f1, credible),
    }
    return replace(final, report=report)


def _decision_text(choice: Choice, nested: Nested, none_f1: float, credible: bool) -> str:
    bound = f"{nested.lower_bound:+.2f}" if np.isfinite(nested.lower_bound) else "none (one group)"
    judged = (
        f"nested cross-validation over {len(nested.groups)} {nested.grouping}s: gain {nested.mean_gain:+.2f} "
        f"F1, 95% lower bound {bound}"
    )
    if credible:
        return f"{choice.rule} rule, cross-validated F1 {choice.f1:.2f} vs {none_f1:.2f} answering none ({judged})"
    return f"answer nothing: no rule credibly beat answering none ({judged})"


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
    """The candidate feature sets chosen among inside the cross-validation (:func:`fit_answerability`),
    the simpler first. With little calibration data the verifier alone usually wins: the model's
    scores add variance, not signal."""
    a = fit_answerability(
        examples, predictions, [FitOptions(FEATURE_SETS[n], calibration) for n in candidates], verifier
    )
    chosen = next(n for n in candidates if FEATURE_SETS[n] == tuple(a.report["features"]))
    return replace(a, report=a.report | {"feature_set": chosen, "candidates": list(candidates)})


# `--answerability` of train.finetune and train.calibrate: a feature set, or auto (see fit_auto).
ANSWERABILITY_CHOICES = ("auto", "verifier", "verifier-only", "model-scores", "cls")


def fit_for(
    choice: str,
    train_examples: Sequence[SquadExample],
    heldout_examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    calibration: str = "platt",
    rerank: bool = False,
    rule_examples: Sequence[SquadExample] | None = None,
    reranker_model: str = "linear",
) -> Answerability:
    """The answerability ``choice`` names: the question verifier from the fine-tuning questions, the
    rest cross-fitted on the held-out questions (ValueError when they cannot support a fit). With
    ``rerank``, a span re-ranker is fitted on the held-out questions first and the rule is fitted on
    the re-ranked spans, which is what it will decide on; it is stored with the rule. ``rule_examples``
    (a subset of the held-out questions): the ones the rule is fitted on, when not all of them are drawn
    from the mix of answerable and unanswerable questions it will decide on. ``reranker_model``: the
    re-ranker's form (rerank_fit.RERANK_MODELS)."""
    if choice not in ANSWERABILITY_CHOICES or choice == "cls":
        raise ValueError(f"nothing to fit for --answerability {choice}")
    rule_examples = heldout_examples if rule_examples is None else rule_examples
    reranker, not_reranked = None, None
    if rerank:
        try:
            reranker = fit_reranker(heldout_examples, predictions, model=reranker_model)
        except ValueError as exc:  # no answerable question with a partly right span: the reader's order
            not_reranked = f"no span re-ranker: {exc}"
        else:
            predictions = reranked(heldout_examples, predictions, reranker)
    verifier, verifier_report = None, None
    if choice == "auto" or VERIFIER_LOGIT in FEATURE_SETS[choice]:
        verifier, verifier_report = fit_question_verifier(train_examples)
    if choice == "auto":
        assert verifier is not None
        a = fit_auto(rule_examples, predictions, verifier, calibration)
    else:
        a = fit_answerability(
            rule_examples, predictions, FitOptions(FEATURE_SETS[choice], calibration), verifier
        )
    if verifier_report is not None:
        a.report["verifier"] = verifier_report
    if not_reranked is not None:
        a.report["reranker"] = not_reranked
    return replace(a, reranker=reranker) if reranker is not None else a
