"""scikit-learn estimators fitted for the answerability, turned into the plain numbers the torch- and
scikit-learn-free decoder applies (:class:`qa_core.squad.answerability_params.Linear`, :class:`Answerability`).

The question verifier (stage 1) and the combining model with its calibration (stage 2), plus the
span-F1 model of the expected-gain rule; scikit-learn is imported only inside the functions that fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qa_core.squad import SquadExample
from qa_core.squad.answerability import FITTED_RULES, Answerability, SpanF1
from qa_core.squad.answerability_features import (
    MODEL_FEATURES,
    QUESTION_FEATURES,
    SPAN_FEATURES,
    VERIFIER_LOGIT,
)
from qa_core.squad.answerability_params import Linear
from train.answerability.table import (
    SPAN_F1_FEATURES,
    Table,
    fold_groups,
    group_folds,
    question_table,
    table_folds,
)

# The combining model's inputs, by name (`--answerability` in train.finetune).
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "cls": ("cls_logit",),
    "model-scores": MODEL_FEATURES,
    "verifier-only": (VERIFIER_LOGIT,),
    "verifier": (VERIFIER_LOGIT, *MODEL_FEATURES),
}
CALIBRATION_METHODS = ("platt", "isotonic")
_SKLEARN_METHOD = {"platt": "sigmoid", "isotonic": "isotonic"}
VERIFIER_C = 0.1  # inverse L2 strength of the question verifier (standardised features)


def logistic(c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))


def as_linear(pipeline, names: Sequence[str]) -> Linear:
    scaler, model = pipeline.steps[0][1], pipeline.steps[1][1]
    coef = model.coef_[0] if model.coef_.ndim == 2 else model.coef_
    intercept = model.intercept_[0] if np.ndim(model.intercept_) else model.intercept_
    return Linear(
        features=tuple(names),
        center=tuple(float(v) for v in scaler.mean_),
        scale=tuple(float(v) if v > 0 else 1.0 for v in scaler.scale_),
        coef=tuple(float(v) for v in coef),
        intercept=float(intercept),
    )


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """ROC AUC of ``scores`` for ``positive`` (None when only one class is present)."""
    from sklearn.metrics import roc_auc_score

    if positive.all() or not positive.any():
        return None
    return float(roc_auc_score(positive.astype(int), scores))


def fit_question_verifier(examples: Sequence[SquadExample]) -> tuple[Linear, dict[str, Any]]:
    """The question verifier fitted on labelled questions (the fine-tuning set: it reads no model
    output), with its cross-validated ROC AUC over articles in the report."""
    x, y, articles = question_table(examples)
    if not 0 < int(y.sum()) < len(y):
        raise ValueError("the question verifier needs answerable and unanswerable questions")
    report: dict[str, Any] = {"questions": len(y), "answerable": int(y.sum())}
    if len(set(articles.tolist())) >= 2:
        oof = np.zeros(len(y))
        for held in group_folds(articles):
            train = np.setdiff1d(np.arange(len(y)), held)
            if 0 < int(y[train].sum()) < len(train):
                oof[held] = logistic(VERIFIER_C).fit(x[train], y[train]).decision_function(x[held])
        report["cv_roc_auc"] = roc_auc(oof, y)
    return as_linear(logistic(VERIFIER_C).fit(x, y), QUESTION_FEATURES), report


# ---------------------------------------------------------------- stage 2: combine, calibrate, decide
@dataclass(frozen=True)
class FitOptions:
    features: tuple[str, ...] = FEATURE_SETS["verifier"]
    calibration: str = "platt"
    rules: tuple[str, ...] = FITTED_RULES
    c: float = 1.0  # inverse L2 strength of the combining model (standardised features)

    def __post_init__(self) -> None:
        allowed = FEATURE_SETS["verifier"] + QUESTION_FEATURES + SPAN_FEATURES
        unknown = [f for f in self.features if f not in allowed]
        if unknown or not self.features:
            raise ValueError(f"unknown answerability features {unknown}; choose from {allowed}")
        if self.calibration not in CALIBRATION_METHODS:
            raise ValueError(f"calibration must be one of {CALIBRATION_METHODS}, got {self.calibration!r}")
        if not self.rules or any(r not in FITTED_RULES for r in self.rules):
            raise ValueError(f"rules must be drawn from {FITTED_RULES}, got {self.rules}")


def _calibration_splits(t: Table) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, held-out) rows of the inner grouped folds that hold both classes to train on."""
    inner, _ = table_folds(t)
    splits = [(np.setdiff1d(np.arange(len(t)), held), held) for held in inner]
    splits = [(tr, te) for tr, te in splits if 0 < int(t.answerable[tr].sum()) < len(tr)]
    if not splits:
        raise ValueError("every calibration fold lacks answerable or unanswerable questions")
    return splits


def fit_calibrated(t: Table, opts: FitOptions):
    """scikit-learn's CalibratedClassifierCV(ensemble=False) over standardise + logistic regression:
    fitted on all of ``t``, its calibration map learnt on the inner (grouped) out-of-fold scores."""
    from sklearn.calibration import CalibratedClassifierCV

    model = CalibratedClassifierCV(
        logistic(opts.c), method=_SKLEARN_METHOD[opts.calibration], cv=_calibration_splits(t), ensemble=False
    )
    return model.fit(t.columns(opts.features), t.answerable.astype(int))


def out_of_fold_probs(model, t: Table, opts: FitOptions) -> np.ndarray:
    """P(answerable) of every row of ``t`` from a logistic model fitted without the row's fold, mapped
    by ``model``'s calibration: the out-of-fold scores CalibratedClassifierCV learnt its map on. A
    threshold chosen on them is a threshold on out-of-fold scores (the map is monotone). Rows of a
    fold that could not be fitted get the base rate."""
    x, y = t.columns(opts.features), t.answerable.astype(int)
    calibrator = model.calibrated_classifiers_[0].calibrators[0]
    out = np.full(len(t), float(y.mean()))
    for train, held in _calibration_splits(t):
        scores = logistic(opts.c).fit(x[train], y[train]).decision_function(x[held])
        out[held] = np.clip(calibrator.predict(scores), 0.0, 1.0)
    return out


def as_answerability(model, opts: FitOptions, verifier: Linear | None) -> Answerability:
    """A fitted CalibratedClassifierCV as the plain numbers the decoder applies (no scikit-learn there)."""
    cc = model.calibrated_classifiers_[0]
    calibrator = cc.calibrators[0]
    kw: dict[str, Any] = {}
    if opts.calibration == "platt":
        kw["platt"] = (float(calibrator.a_), float(calibrator.b_))
    else:
        kw["isotonic"] = (
            tuple(float(v) for v in calibrator.X_thresholds_),
            tuple(float(v) for v in calibrator.y_thresholds_),
        )
    return Answerability(
        as_linear(cc.estimator, opts.features), verifier=verifier, calibration=opts.calibration, **kw
    )


def calibrated(t: Table, opts: FitOptions, verifier: Linear | None) -> Answerability:
    return as_answerability(fit_calibrated(t, opts), opts, verifier)


def answerable_probs(a: Answerability, t: Table) -> np.ndarray:
    return np.array([a.probabilities(r)[0] for r in t.rows(a.model.features)])


def fit_span_f1(t: Table) -> SpanF1:
    """E[F1 of the best span | span evidence] on the answerable rows: a ridge score, then an isotonic
    map learnt on out-of-fold scores (whole articles or paragraphs held out), so that the map is what
    the score says of questions it was not fitted on. An in-sample map follows the noise: on features
    that carry no signal it gave some fresh questions g = 0.62."""
    from sklearn.isotonic import IsotonicRegression

    rows = np.flatnonzero(t.answerable & t.has_span)
    x, y = t.columns(SPAN_F1_FEATURES)[rows], t.answer_f1[rows]
    if rows.size < 5:
        return _flat_span_f1(float(y.mean()) if y.size else 0.0)
    oof = np.full(rows.size, np.nan)
    groups, _ = fold_groups(t.articles[rows], t.paragraphs[rows])
    if len(set(groups.tolist())) >= 2:
        for held in group_folds(groups):
            fit = np.setdiff1d(np.arange(rows.size), held)
            if fit.size >= 2:
                oof[held] = _ridge().fit(x[fit], y[fit]).predict(x[held])
    known = ~np.isnan(oof)
    if known.sum() < 5:
        return _flat_span_f1(float(y.mean()))
    score = as_linear(_ridge().fit(x, y), SPAN_F1_FEATURES)
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(oof[known], y[known])
    return SpanF1(score, (tuple(map(float, iso.X_thresholds_)), tuple(map(float, iso.y_thresholds_))))


def _ridge():
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), Ridge(alpha=1.0))


def _flat_span_f1(value: float) -> SpanF1:
    """Too few answerable questions to learn from: every span is expected to score ``value``."""
    n = len(SPAN_F1_FEATURES)
    return SpanF1(Linear(SPAN_F1_FEATURES, (0.0,) * n, (1.0,) * n, (0.0,) * n, 0.0), ((0.0,), (value,)))
