"""Fit the span re-ranker (:mod:`qa_core.squad.rerank`) on articles the reader never trained on.

Each answerable question contributes its top ``top_k`` candidates (snapped to whole words), each
labelled with its F1 against the gold answers. The model is a logistic regression on standardised
features whose target is that F1: every candidate counts as "right" with weight F1 and "wrong" with
weight 1 - F1, so its logit orders candidates by expected F1. Unanswerable questions have no gold span
and teach it nothing.

The report is cross-fitted by article: for each article the model is fitted on the others and ranks
that article's spans, so the span F1 with and without re-ranking is compared on questions the model
never saw, article by article. The stored model is then fitted on every article.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from qa_core.squad import Prediction, SquadExample
from qa_core.squad.answerability_features import match_question
from qa_core.squad.answerability_params import AnswerabilityError, Linear
from qa_core.squad.rerank import CANDIDATE_FEATURES, TOP_K, SpanReranker, candidate_features, snapped
from qa_core.squad.trees import BoostedTrees, Tree
from train.answerability.estimators import as_linear, logistic
from train.answerability.table import context_indexes, group_folds
from train.squad.metrics import best_exact_f1

RERANK_C = 1.0  # inverse L2 strength (standardised features); not tuned


class CandidateTable:
    """Every answerable question's top candidates: features, F1 label, question and article."""

    def __init__(
        self,
        examples: Sequence[SquadExample],
        predictions: Mapping[str, Prediction],
        top_k: int = TOP_K,
    ) -> None:
        rows: list[list[float]] = []
        labels: list[float] = []
        qrow: list[int] = []
        ranks: list[int] = []  # the reader's order within its question (after snapping)
        raw: list[float] = []  # the reader's best span as it is, not snapped
        self.questions: list[SquadExample] = []
        indexes, _ = context_indexes(examples)
        for ex in examples:
            p = predictions.get(ex.qas_id)
            if p is None or not ex.answers or not p.n_best:
                continue
            index = indexes[ex.context]
            head = snapped(ex.context, p.n_best[:top_k])  # as SpanReranker.rerank takes its head
            feats = candidate_features(ex.question, index, match_question(ex.question, index), head)
            q = len(self.questions)
            self.questions.append(ex)
            raw.append(best_exact_f1(ex.answer_texts, p.n_best[0].text)[1])
            for rank, (e, f) in enumerate(zip(head, feats, strict=True)):
                rows.append(f.tolist())
                labels.append(best_exact_f1(ex.answer_texts, e.text)[1])
                qrow.append(q)
                ranks.append(rank)
        self.x = np.array(rows, dtype=np.float64).reshape(-1, len(CANDIDATE_FEATURES))
        self.f1 = np.array(labels, dtype=np.float64)
        self.question = np.array(qrow, dtype=np.int64)
        self.rank = np.array(ranks, dtype=np.int64)
        self.articles = np.array([self.questions[q].title for q in qrow])
        self.raw_f1 = np.array(raw, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.questions)


RERANK_MODELS = ("linear", "trees")
RERANKER_HELP = (
    "the span re-ranker's form: a logistic model (linear) or boosted trees regressing each candidate's F1 "
    "(trees: better spans out of fold, docs/study.md; about 0.08 ms more to decode a question)"
)
# boosted trees' settings: set once before they were measured (docs/study.md), not tuned
TREES = {"max_depth": 3, "learning_rate": 0.05, "max_iter": 300, "random_state": 0}


class _LinearFit:
    def __init__(self, x: np.ndarray, f1: np.ndarray) -> None:
        self.model = _fit(x, f1)

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.model.decision_function(x)

    def stored(self) -> Linear:
        return as_linear(self.model, CANDIDATE_FEATURES)


class _TreesFit:
    def __init__(self, x: np.ndarray, f1: np.ndarray) -> None:
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.model = HistGradientBoostingRegressor(**TREES).fit(x, f1)

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.model.predict(x)

    def stored(self) -> BoostedTrees:
        return as_trees(self.model, CANDIDATE_FEATURES)


def as_trees(model, names: Sequence[str]) -> BoostedTrees:
    """A fitted scikit-learn ``HistGradientBoostingRegressor`` (squared error, numerical features) as the
    plain numbers the decoder applies, checked as a stored model is when read (ValueError: what the
    decoder would refuse, e.g. more tests per candidate than it applies)."""
    if getattr(model, "is_categorical_", None) is not None and np.any(model.is_categorical_):
        raise ValueError("categorical features are not stored")
    trees = []
    for (predictor,) in model._predictors:  # one tree per round for a regressor
        nodes = predictor.nodes
        leaf = nodes["is_leaf"].astype(bool)  # a leaf's split fields are unused: stored as -1 / 0
        trees.append(
            Tree(
                feature=tuple(np.where(leaf, -1, nodes["feature_idx"]).tolist()),
                threshold=tuple(np.where(leaf, 0.0, nodes["num_threshold"]).tolist()),
                left=tuple(np.where(leaf, 0, nodes["left"]).astype(np.int64).tolist()),
                right=tuple(np.where(leaf, 0, nodes["right"]).astype(np.int64).tolist()),
                missing_left=tuple(nodes["missing_go_to_left"].astype(bool).tolist()),
                value=tuple(nodes["value"].tolist()),
            )
        )
    baseline = float(np.ravel(model._baseline_prediction)[0])
    made = BoostedTrees(tuple(names), baseline, tuple(trees))
    try:
        return BoostedTrees.from_dict(made.to_dict(), "the fitted trees", names)
    except AnswerabilityError as exc:
        raise ValueError(str(exc)) from None


def _fit(x: np.ndarray, f1: np.ndarray):
    """Logistic regression on F1 as a soft label (each row twice: right with weight F1, wrong with 1 - F1)."""
    xs = np.concatenate([x, x])
    ys = np.concatenate([np.ones(len(x)), np.zeros(len(x))])
    w = np.concatenate([f1, 1.0 - f1])
    model = logistic(RERANK_C)
    model.fit(xs, ys, logisticregression__sample_weight=w)
    return model


def _chosen_f1(t: CandidateTable, scores: np.ndarray, rows: np.ndarray) -> dict[int, float]:
    """Per question (of ``rows``): the F1 of its highest-scored candidate (ties: the reader's order)."""
    out: dict[int, float] = {}
    best: dict[int, float] = {}
    for r in rows:  # rows are in reader order within a question
        q = int(t.question[r])
        if q not in best or scores[r] > best[q]:
            best[q], out[q] = float(scores[r]), float(t.f1[r])
    return out


def fit_reranker(
    examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    top_k: int = TOP_K,
    model: str = "linear",
) -> SpanReranker:
    """The re-ranker fitted on every answerable question, with a report cross-fitted by article:
    span F1 of the reader's best span and of the re-ranked best, per article, on articles the
    model was not fitted on. ``model``: "linear" (logistic regression on F1 as a soft label) or
    "trees" (boosted trees regressing F1). ValueError when there is nothing to fit on."""
    if model not in RERANK_MODELS:
        raise ValueError(f"the re-ranker's model must be one of {RERANK_MODELS}, not {model!r}")
    fitter = _TreesFit if model == "trees" else _LinearFit
    t = CandidateTable(examples, predictions, top_k)
    if len(t) == 0 or not (0 < t.f1.sum() < len(t.f1)):
        raise ValueError("the re-ranker needs answerable questions whose candidates are partly right")
    report: dict[str, Any] = {
        "questions": len(t),
        "candidates": int(len(t.f1)),
        "top_k": top_k,
        "model": model,
    }
    reader_rank = -t.rank.astype(np.float64)  # the reader's own order as a score: first is highest
    if len(set(t.articles.tolist())) >= 2:
        per_article: dict[str, dict[str, float]] = {}
        for held in group_folds(t.articles, max_folds=len(set(t.articles.tolist()))):
            train = np.setdiff1d(np.arange(len(t.f1)), held)
            scores = fitter(t.x[train], t.f1[train]).scores(t.x[held])
            full = np.full(len(t.f1), -np.inf)
            full[held] = scores
            on, off = _chosen_f1(t, full, held), _chosen_f1(t, reader_rank, held)
            title = str(t.articles[held[0]])
            per_article[title] = {
                "questions": len(on),
                "reader": 100 * float(np.mean([t.raw_f1[q] for q in on])),
                "snapped": 100 * float(np.mean(list(off.values()))),
                "reranked": 100 * float(np.mean(list(on.values()))),
            }
        report["cross_fitted"] = per_article
    return SpanReranker(fitter(t.x, t.f1).stored(), top_k, report)


def reranked(
    examples: Sequence[SquadExample], predictions: Mapping[str, Prediction], reranker: SpanReranker
) -> dict[str, Prediction]:
    """Each prediction with its spans re-ranked (the decision is not re-taken: redecide does that)."""
    out = dict(predictions)
    indexes, _ = context_indexes(examples)
    for ex in examples:
        p = predictions.get(ex.qas_id)
        if p is not None and p.n_best:
            out[ex.qas_id] = p.reranked_by(reranker, ex.question, indexes[ex.context])
    return out
