"""Does the boosted-tree re-ranker's predicted F1 of the span it chose tell answerable questions from
unanswerable ones beyond the rule's P(answerable)? Nested by fold, on a finished cross-fit's kept spans.

For each fold the re-ranker is fitted on the other folds' out-of-fold spans (as train.crossfit does) and
scores the fold's top 10; the chosen span's predicted F1 and its margin over the second are then added to
the rule's logit(P(answerable)) (from the refit's questions.json) in a logistic model fitted on the other
folds' articles with unanswerable questions and applied to the fold's. Prints ROC AUCs over those
articles' questions.

    PYTHONPATH=. python docs/study/crossfit-trees/reranker_feature.py runs/crossfit-4fold-1600 \\
        runs/crossfit-trees/crossfit-4fold-1600/questions.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression

from qa_core.squad.answerability_features import ContextIndex
from qa_core.squad.rerank import snapped
from train.answerability.estimators import roc_auc
from train.answerability.rerank_fit import fit_reranker
from train.experiments.pipeline_crossfit import load_outputs, mixed_articles


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def main() -> int:
    run, rows_file = Path(sys.argv[1]), Path(sys.argv[2])
    examples, readers, fold_of = load_outputs(run)
    folds = sorted(examples)
    every = [ex for f in folds for ex in examples[f]]
    rows = json.loads(rows_file.read_text())
    assert [r["article"] for r in rows] == [ex.title for ex in every], "rows of another run"
    by_id = {ex.qas_id: r for ex, r in zip(every, rows, strict=True)}
    chosen: dict[str, tuple[float, float]] = {}
    for f in folds:
        others = [ex for g in folds if g != f for ex in examples[g]]
        other_predictions = {q: p for g in folds if g != f for q, p in readers[g].items()}
        reranker = fit_reranker(others, other_predictions, model="trees")
        indexes: dict[str, ContextIndex] = {}
        for ex in examples[f]:
            head = snapped(ex.context, readers[f][ex.qas_id].n_best[: reranker.top_k])
            if not head:
                chosen[ex.qas_id] = (0.0, 0.0)
                continue
            index = indexes.setdefault(ex.context, ContextIndex(ex.context))
            scores = sorted(reranker.scores(ex.question, index, head))
            chosen[ex.qas_id] = (scores[-1], scores[-1] - scores[-2] if len(scores) > 1 else 0.0)
    mixed = mixed_articles(every)
    kept = [ex for ex in every if ex.title in mixed]
    x = np.array([[_logit(by_id[ex.qas_id]["answerable_prob"]), *chosen[ex.qas_id]] for ex in kept])
    y = np.array([bool(by_id[ex.qas_id]["answerable"]) for ex in kept])
    fold = np.array([fold_of[ex.title] for ex in kept])
    print(f"{len(kept)} questions of the {len(mixed)} articles with unanswerable questions, {run}\n")
    print(f"- ROC AUC of the rule's P(answerable): {roc_auc(x[:, 0], y):.4f}")
    print(f"- ROC AUC of the chosen span's predicted F1 alone: {roc_auc(x[:, 1], y):.4f}")
    for cols, name in (
        ([0], "the rule's logit alone"),
        ([0, 1], "+ predicted F1"),
        ([0, 1, 2], "+ its margin"),
    ):
        out = np.zeros(len(y))
        for f in folds:
            fitted = LogisticRegression(max_iter=1000).fit(x[fold != f][:, cols], y[fold != f])
            out[fold == f] = fitted.decision_function(x[fold == f][:, cols])
        print(f"- nested by fold, {name}: ROC AUC {roc_auc(out, y):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
