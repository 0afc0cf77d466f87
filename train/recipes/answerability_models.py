"""scikit-learn estimators fitted for the answerability, turned into the plain numbers the torch- and
scikit-learn-free decoder applies (:class:`train.squad.linear.Linear`, :class:`Answerability`).

The question verifier (stage 1) and the combining model with its calibration (stage 2), plus the
span-F1 model of the expected-gain rule; scikit-learn is imported only inside the functions that fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from train.recipes.answerability_table import (
    SPAN_F1_FEATURES,
    Table,
    group_folds,
    question_table,
    table_folds,
)
from train.squad import SquadExample
from train.squad.answerability import RULES, Answerability, SpanF1
from train.squad.answerability_features import (
    MODEL_FEATURES,
    QUESTION_FEATURES,
    SPAN_FEATURES,
    VERIFIER_LOGIT,
)
from train.squad.linear import Linear

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
    rules: tuple[str, ...] = RULES
    c: float = 1.0  # inverse L2 strength of the combining model (standardised features)

    def __post_init__(self) -> None:
        allowed = FEATURE_SETS["verifier"] + QUESTION_FEATURES + SPAN_FEATURES
        unknown = [f for f in self.features if f not in allowed]
        if unknown or not self.features:
            raise ValueError(f"unknown answerability features {unknown}; choose from {allowed}")
        if self.calibration not in CALIBRATION_METHODS:
            raise ValueError(f"calibration must be one of {CALIBRATION_METHODS}, got {self.calibration!r}")
        if not self.rules or any(r not in RULES for r in self.rules):
            raise ValueError(f"rules must be drawn from {RULES}, got {self.rules}")


def fit_calibrated(t: Table, opts: FitOptions):
    """scikit-learn's CalibratedClassifierCV(ensemble=False) over standardise + logistic regression:
    fitted on all of ``t``, its calibration map learnt on the inner (grouped) out-of-fold scores."""
    from sklearn.calibration import CalibratedClassifierCV

    inner, _ = table_folds(t)
    splits = [(np.setdiff1d(np.arange(len(t)), held), held) for held in inner]
    splits = [(tr, te) for tr, te in splits if 0 < int(t.answerable[tr].sum()) < len(tr)]
    if not splits:
        raise ValueError("every calibration fold lacks answerable or unanswerable questions")
    model = CalibratedClassifierCV(
        logistic(opts.c), method=_SKLEARN_METHOD[opts.calibration], cv=splits, ensemble=False
    )
    return model.fit(t.columns(opts.features), t.answerable.astype(int))


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
    """E[F1 of the best span | span evidence] on the answerable rows: ridge score -> isotonic map."""
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rows = t.answerable & t.has_span
    x, y = t.columns(SPAN_F1_FEATURES)[rows], t.answer_f1[rows]
    if rows.sum() < 5:
        flat = Linear(SPAN_F1_FEATURES, (0.0,) * 5, (1.0,) * 5, (0.0,) * 5, 0.0)
        return SpanF1(flat, ((0.0,), (float(y.mean()) if y.size else 0.0,)))
    pipeline = make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(x, y)
    score = as_linear(pipeline, SPAN_F1_FEATURES)
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(pipeline.predict(x), y)
    return SpanF1(score, (tuple(map(float, iso.X_thresholds_)), tuple(map(float, iso.y_thresholds_))))
