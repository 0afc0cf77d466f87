"""The answerability fit's data: one row per question (features and outcomes), and folds of whole
articles (or paragraphs) so that nothing is scored by what was fitted on it. No scikit-learn here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qa_core.squad import Prediction, SquadExample
from qa_core.squad.answerability_features import (
    QUESTION_FEATURES,
    SPAN_FEATURES,
    ContextIndex,
    all_features,
    question_features,
)
from qa_core.squad.answerability_params import Linear
from train.squad.metrics import compute_f1, gold_answers

# What the span-F1 model (the expected-gain rule's E[F1 of the best span]) reads.
SPAN_F1_FEATURES = ("span_log_prob", "span_top_prob", *SPAN_FEATURES)
MAX_FOLDS = 5  # folds at each level of the (nested) cross-fitting: its cost grows as the cube


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


def context_indexes(examples: Sequence[SquadExample]) -> tuple[dict[str, ContextIndex], dict[str, int]]:
    """Each distinct context's sentence index (built once) and its paragraph number."""
    indexes: dict[str, ContextIndex] = {}
    ids: dict[str, int] = {}
    for ex in examples:
        if ex.context not in indexes:
            indexes[ex.context] = ContextIndex(ex.context)
            ids[ex.context] = len(ids)
    return indexes, ids


def question_table(examples: Sequence[SquadExample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Question-verifier features, labels and articles of labelled questions (no QA model needed)."""
    indexes, _ = context_indexes(examples)
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
    indexes, paragraph_ids = context_indexes(rows)
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


def fittable(t: Table) -> bool:
    """Both classes present, and enough groups to calibrate on out-of-fold scores."""
    groups, _ = fold_groups(t.articles, t.paragraphs)
    return 0 < int(t.answerable.sum()) < len(t) and len(set(groups.tolist())) >= 2
