"""Would boosted trees re-rank the reader's spans better than the linear re-ranker? Out of fold by article.

A cross-fitted run's kept spans: every answerable question's top 10 candidates (snapped to words) with
the re-ranker's 11 features and each candidate's F1 against the gold answers (train.answerability's
CandidateTable, as the shipped re-ranker is fitted). Per fold, each model is fitted on the other folds'
candidates and picks one candidate per question of the fold: the reader's first, the linear re-ranker
(logistic regression on F1 as a soft label, as shipped), boosted trees regressing F1, and boosted trees
on the soft label. Span F1 of the picked candidate, each difference over articles with the cluster
bootstrap, the t interval and the sign test. Ties go to the reader's order.

    PYTHONPATH=. .venv/bin/python docs/study/crossfit-rule/reranker_trees.py runs/crossfit-4fold-1600
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

from train.answerability.rerank_fit import CandidateTable, _fit
from train.experiments.article_stats import compare_by_article, describe
from train.experiments.pipeline_crossfit import load_outputs

TREES = {"max_depth": 3, "learning_rate": 0.05, "max_iter": 300, "random_state": 0}


def _reader(t: CandidateTable, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    return -t.rank[test].astype(np.float64)


def _linear(t: CandidateTable, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    return _fit(t.x[train], t.f1[train]).decision_function(t.x[test])


def _trees_f1(t: CandidateTable, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    return HistGradientBoostingRegressor(**TREES).fit(t.x[train], t.f1[train]).predict(t.x[test])


def _trees_soft(t: CandidateTable, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    x, f1 = t.x[train], t.f1[train]
    both = np.concatenate([np.ones(len(x)), np.zeros(len(x))])
    model = HistGradientBoostingClassifier(**TREES)
    model.fit(np.concatenate([x, x]), both, sample_weight=np.concatenate([f1, 1.0 - f1]))
    return model.predict_proba(t.x[test])[:, 1]


MODELS: dict[str, Callable[[CandidateTable, np.ndarray, np.ndarray], np.ndarray]] = {
    "the reader's first span": _reader,
    "linear re-ranker (shipped)": _linear,
    "boosted trees, F1 regressed": _trees_f1,
    "boosted trees, F1 as soft label": _trees_soft,
}


def picked_f1(t: CandidateTable, scores: np.ndarray) -> np.ndarray:
    """Each question's F1 of its highest-scoring candidate (the earlier in the reader's order on ties)."""
    out = np.zeros(len(t.questions))
    best = np.full(len(t.questions), -np.inf)
    for row in np.lexsort((t.rank, -scores)):  # best score first, then the reader's order
        q = t.question[row]
        if best[q] == -np.inf:
            best[q], out[q] = scores[row], t.f1[row]
    return out


def main(run: Path) -> None:
    examples, readers, fold_of = load_outputs(run)
    questions = [ex for f in sorted(examples) for ex in examples[f]]
    predictions = {q: p for f in readers for q, p in readers[f].items()}
    t = CandidateTable(questions, predictions)
    fold = np.array([fold_of[ex.title] for ex in t.questions])[t.question]
    titles = [ex.title for ex in t.questions]
    f1: dict[str, np.ndarray] = {}
    for name, model in MODELS.items():
        scores = np.zeros(len(t.f1))
        for f in sorted(set(fold.tolist())):
            scores[fold == f] = model(t, fold != f, fold == f)
        f1[name] = picked_f1(t, scores)
    print(
        f"{run}: {len(t.questions)} answerable questions of {len(set(titles))} articles, {len(t.f1)} candidates\n"
    )
    for name, values in f1.items():
        print(f"- {name}: span F1 {100 * values.mean():.2f}")
    linear = f1["linear re-ranker (shipped)"]
    print()
    for name in ("boosted trees, F1 regressed", "boosted trees, F1 as soft label"):
        print(f"- {name} vs linear: {describe(compare_by_article(f1[name], linear, titles))}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
