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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from train.squad import Prediction, SquadExample
from train.squad.answerability import RULES, Answerability, SpanF1
from train.squad.answerability_features import (
    MODEL_FEATURES,
    QUESTION_FEATURES,
    SPAN_FEATURES,
    VERIFIER_LOGIT,
    ContextIndex,
    all_features,
    question_features,
)
from train.squad.linear import Linear
from train.squad.metrics import compute_f1, gold_answers

# The combining model's inputs, by name (`--answerability` in train.finetune).
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "cls": ("cls_logit",),
    "model-scores": MODEL_FEATURES,
    "verifier-only": (VERIFIER_LOGIT,),
    "verifier": (VERIFIER_LOGIT, *MODEL_FEATURES),
}
SPAN_F1_FEATURES = ("span_log_prob", "span_top_prob", *SPAN_FEATURES)
CALIBRATION_METHODS = ("platt", "isotonic")
_SKLEARN_METHOD = {"platt": "sigmoid", "isotonic": "isotonic"}
MAX_FOLDS = 10
VERIFIER_C = 0.1  # inverse L2 strength of the question verifier (standardised features)


# ---------------------------------------------------------------- tables
@dataclass
class Table:
    """One row per question: features, labels, what answering and abstaining would score, groups."""

    qids: list[str]
    names: tuple[str, ...]
    x: np.ndarray  # [n, f]
    answerable: np.ndarray  # [n] bool
    answer_f1: np.ndarray  # [n] F1 of the best span (0 for an unanswerable question)
    abstain_f1: np.ndarray  # [n] 1 for an unanswerable question, else 0
    has_span: np.ndarray  # [n] bool: a span exists to answer with
    articles: np.ndarray  # [n] article title
    paragraphs: np.ndarray  # [n] context number within the set

    def __len__(self) -> int:
        return len(self.qids)

    def subset(self, rows: np.ndarray) -> Table:
        return Table(
            [self.qids[i] for i in rows],
            self.names,
            self.x[rows],
            self.answerable[rows],
            self.answer_f1[rows],
            self.abstain_f1[rows],
            self.has_span[rows],
            self.articles[rows],
            self.paragraphs[rows],
        )

    def columns(self, names: Sequence[str]) -> np.ndarray:
        return self.x[:, [self.names.index(n) for n in names]]

    def rows(self, names: Sequence[str]) -> list[dict[str, float]]:
        cols = self.columns(names)
        return [dict(zip(names, r.tolist(), strict=True)) for r in cols]


def _indexes(examples: Sequence[SquadExample]) -> tuple[dict[str, ContextIndex], dict[str, int]]:
    indexes: dict[str, ContextIndex] = {}
    ids: dict[str, int] = {}
    for ex in examples:
        if ex.context not in indexes:
            indexes[ex.context] = ContextIndex(ex.context)
            ids[ex.context] = len(ids)
    return indexes, ids


def question_table(examples: Sequence[SquadExample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Question-verifier features, labels and articles of labelled questions (no QA model needed)."""
    indexes, _ = _indexes(examples)
    x = []
    for ex in examples:
        feats = question_features(ex.question, indexes[ex.context])
        x.append([feats[n] for n in QUESTION_FEATURES])
    return (
        np.asarray(x, dtype=np.float64).reshape(len(examples), len(QUESTION_FEATURES)),
        np.array([bool(ex.answers) for ex in examples]),
        np.array([ex.title for ex in examples]),
    )


def build_table(
    examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    names: Sequence[str],
    verifier: Linear | None = None,
) -> Table:
    """Features ``names`` (+ the span-F1 model's) and outcomes of every example with a prediction."""
    rows = [ex for ex in examples if ex.qas_id in predictions]
    if not rows:
        raise ValueError("no predictions for the given questions")
    columns = tuple(dict.fromkeys([*names, *SPAN_F1_FEATURES]))
    indexes, paragraph_ids = _indexes(rows)
    x, answer_f1, has_span = [], [], []
    for ex in rows:
        p = predictions[ex.qas_id]
        scores = p.span_scores()
        feats = all_features(ex.question, indexes[ex.context], scores, columns, verifier)
        x.append([feats[n] for n in columns])
        best = p.best_span_text
        answer_f1.append(max(compute_f1(g, best) for g in gold_answers(ex.answer_texts)) if best else 0.0)
        has_span.append(scores.best_log_prob is not None)
    answerable = np.array([bool(ex.answers) for ex in rows])
    return Table(
        qids=[ex.qas_id for ex in rows],
        names=columns,
        x=np.asarray(x, dtype=np.float64),
        answerable=answerable,
        answer_f1=np.where(answerable, np.asarray(answer_f1), 0.0),
        abstain_f1=(~answerable).astype(np.float64),
        has_span=np.asarray(has_span),
        articles=np.array([ex.title for ex in rows]),
        paragraphs=np.array([paragraph_ids[ex.context] for ex in rows]),
    )


# ---------------------------------------------------------------- folds
def fold_groups(articles: np.ndarray, paragraphs: np.ndarray) -> tuple[np.ndarray, str]:
    """Articles when there are at least two, else paragraphs."""
    if len(set(articles.tolist())) >= 2:
        return articles, "article"
    return paragraphs, "paragraph"


def group_folds(groups: np.ndarray, max_folds: int = MAX_FOLDS) -> list[np.ndarray]:
    """Held-out row indices per fold: whole groups, dealt largest first to the smallest fold."""
    unique = sorted(set(groups.tolist()))
    if len(unique) < 2:
        raise ValueError("cross-fitting needs at least two articles or paragraphs")
    k = min(max_folds, len(unique))
    sizes = {g: int((groups == g).sum()) for g in unique}
    bins: list[list[Any]] = [[] for _ in range(k)]
    load = [0] * k
    for g in sorted(unique, key=lambda g: (-sizes[g], g)):
        j = int(np.argmin(load))
        bins[j].append(g)
        load[j] += sizes[g]
    return [np.flatnonzero(np.isin(groups, b)) for b in bins]


def table_folds(t: Table) -> tuple[list[np.ndarray], str]:
    groups, kind = fold_groups(t.articles, t.paragraphs)
    return group_folds(groups), kind


def _fittable(t: Table) -> bool:
    """Both classes present, and enough groups to calibrate on out-of-fold scores."""
    groups, _ = fold_groups(t.articles, t.paragraphs)
    return 0 < int(t.answerable.sum()) < len(t) and len(set(groups.tolist())) >= 2


# ---------------------------------------------------------------- stage 1: the question verifier
def _logistic(c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))


def _linear(pipeline, names: Sequence[str]) -> Linear:
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
                oof[held] = _logistic(VERIFIER_C).fit(x[train], y[train]).decision_function(x[held])
        report["cv_roc_auc"] = roc_auc(oof, y)
    return _linear(_logistic(VERIFIER_C).fit(x, y), QUESTION_FEATURES), report


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
        _logistic(opts.c), method=_SKLEARN_METHOD[opts.calibration], cv=splits, ensemble=False
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
        _linear(cc.estimator, opts.features), verifier=verifier, calibration=opts.calibration, **kw
    )


def _calibrated(t: Table, opts: FitOptions, verifier: Linear | None) -> Answerability:
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
    score = _linear(pipeline, SPAN_F1_FEATURES)
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(pipeline.predict(x), y)
    return SpanF1(score, (tuple(map(float, iso.X_thresholds_)), tuple(map(float, iso.y_thresholds_))))


def answers(a: Answerability, t: Table, probs: np.ndarray | None = None) -> np.ndarray:
    """True where the rule answers (a question without a span is never answered)."""
    p = answerable_probs(a, t) if probs is None else probs
    thresholds = np.array([a.no_answer_threshold(r) for r in t.rows(a.features)])
    return ((1.0 - p) <= thresholds) & t.has_span


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


def _oof_probs(t: Table, opts: FitOptions, verifier: Linear | None) -> np.ndarray:
    """Calibrated P(answerable) of every row from a model fitted without the row's group."""
    out = np.full(len(t), float(t.answerable.mean()))
    held_out, _ = table_folds(t)
    for held in held_out:
        train = t.subset(np.setdiff1d(np.arange(len(t)), held))
        if _fittable(train):
            out[held] = answerable_probs(_calibrated(train, opts, verifier), t.subset(held))
    return out


def fit_rules(t: Table, opts: FitOptions, verifier: Linear | None) -> dict[str, Answerability]:
    """Everything fitted on ``t`` alone, under each rule of ``opts``: the threshold chosen on inner
    out-of-fold probabilities, the span-F1 model on the answerable rows."""
    a = _calibrated(t, opts, verifier)
    out: dict[str, Answerability] = {}
    for rule in opts.rules:
        if rule == "expected_gain":
            out[rule] = replace(a, rule="expected_gain", span_f1=fit_span_f1(t))
        else:
            out[rule] = replace(
                a, rule="threshold", threshold=best_threshold(_oof_probs(t, opts, verifier), t)
            )
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
        if not _fittable(train):
            probs[held] = train.answerable.mean()  # nothing to fit: the base rate, and no answers
            continue
        fitted = fit_rules(train, opts, verifier)
        p = answerable_probs(next(iter(fitted.values())), test)  # one calibrated model under every rule
        probs[held] = p
        for rule, a in fitted.items():
            answered[rule][held] = answers(a, test, p)
    return CrossFit(probs, answered, fold_of, grouping)


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
    if not _fittable(t):
        raise ValueError("fitting answerability needs answerable and unanswerable questions in 2+ paragraphs")
    cv = cross_fit(t, opts, verifier)
    none_f1 = float(t.abstain_f1.mean() * 100)
    rule_f1 = {r: float(f1_at(cv.answered[r], t).mean() * 100) for r in opts.rules}
    best_rule = max(opts.rules, key=lambda r: (rule_f1[r], -opts.rules.index(r)))
    beats = rule_f1[best_rule] > none_f1
    per_fold: list[dict[str, Any]] = []
    for k in range(int(cv.fold_of.max()) + 1):
        rows = np.flatnonzero(cv.fold_of == k)
        sub = t.subset(rows)
        per_fold.append(
            {
                "groups": sorted({str(g) for g in fold_groups(t.articles, t.paragraphs)[0][rows]}),
                "questions": len(rows),
                "f1": float(f1_at(cv.answered[best_rule][rows], sub).mean() * 100),
                "no_answer_f1": float(sub.abstain_f1.mean() * 100),
            }
        )
    gains = [float(f["f1"]) - float(f["no_answer_f1"]) for f in per_fold]
    final = fit_rules(t, replace(opts, rules=(best_rule,)), verifier)[best_rule]
    if not beats:
        final = replace(final, rule="threshold", threshold=0.0)
    report = {
        "features": list(opts.features),
        "fitted_on": {"questions": len(t), "answerable": int(t.answerable.sum()), "grouping": cv.grouping},
        "cv": {
            "folds": len(per_fold),
            "rule_f1": rule_f1,
            "no_answer_f1": none_f1,
            "f1": rule_f1[best_rule],
            "gain": rule_f1[best_rule] - none_f1,
            "gain_sd_over_folds": float(np.std(gains, ddof=1)) if len(gains) > 1 else None,
            "roc_auc": roc_auc(cv.probs, t.answerable),
            "answered": int(cv.answered[best_rule].sum()),
            "per_fold": per_fold,
        },
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
