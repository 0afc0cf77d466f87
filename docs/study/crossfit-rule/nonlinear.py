"""Would a nonlinear answerability model read more out of the same features? Out of fold by article.

The first cross-fitted run's kept spans (runs/crossfit-4fold), every feature the rule may read (the
model's scores, the question verifier's inputs, the best span's evidence) for each of the 9,663 questions;
for each fold a logistic regression and two gradient-boosted tree ensembles fitted on the other folds'
questions (all of them, or only those of articles holding both kinds), then the ROC AUC of P(answerable)
on the fold's own questions, pooled and per fold. The spans are the reader's own order (no re-ranker):
the question is whether the model's form matters, not what the shipped rule scores.

    PYTHONPATH=. .venv/bin/python docs/study/crossfit-rule/nonlinear.py runs/crossfit-4fold
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from qa_core.squad.answerability_features import MODEL_FEATURES, QUESTION_FEATURES, SPAN_FEATURES
from train.answerability.table import build_table
from train.experiments.pipeline_crossfit import load_outputs, mixed_articles

MODELS: dict[str, Callable[[], Any]] = {
    "logistic (C 1)": lambda: make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000)),
    "boosted trees, depth 2": lambda: HistGradientBoostingClassifier(
        max_depth=2, learning_rate=0.05, max_iter=300, random_state=0
    ),
    "boosted trees, depth 3": lambda: HistGradientBoostingClassifier(
        max_depth=3, learning_rate=0.05, max_iter=300, l2_regularization=1.0, random_state=0
    ),
}


def main(run: Path) -> None:
    examples, readers, fold_of = load_outputs(run)
    questions = [ex for f in sorted(examples) for ex in examples[f]]
    predictions = {q: p for f in readers for q, p in readers[f].items()}
    names = tuple(dict.fromkeys(MODEL_FEATURES + QUESTION_FEATURES + SPAN_FEATURES))
    t = build_table(questions, predictions, names)
    x = t.x[:, [t.names.index(n) for n in names]]
    y = t.answerable.astype(int)
    fold = np.array([fold_of[a] for a in t.articles])
    mixed = np.isin(t.articles, sorted(mixed_articles(questions)))
    folds = sorted(set(fold.tolist()))
    both = len(mixed_articles(questions))
    print(f"{len(y)} questions of {len(set(t.articles))} articles ({int(mixed.sum())} of them in the {both}")
    print(
        f"articles holding both kinds), {len(names)} features, {len(folds)} folds, out of fold by article.\n"
    )
    print("| fitted on | model | AUC, all questions | AUC, mixed articles' questions | AUC per fold |")
    print("| --- | --- | --- | --- | --- |")
    for fitted_on in ("all articles", "mixed articles"):
        for name, make in MODELS.items():
            p = np.zeros(len(y))
            for f in folds:
                train = (fold != f) & (mixed if fitted_on == "mixed articles" else True)
                p[fold == f] = make().fit(x[train], y[train]).predict_proba(x[fold == f])[:, 1]
            per = ", ".join(f"{roc_auc_score(y[fold == f], p[fold == f]):.3f}" for f in folds)
            print(
                f"| {fitted_on} | {name} | {roc_auc_score(y, p):.3f} | "
                f"{roc_auc_score(y[mixed], p[mixed]):.3f} | {per} |"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
