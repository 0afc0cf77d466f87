"""Two refits of one cross-fitted run compared question by question (their questions.json), articles as
the unit: the decided F1 (all articles, and those holding unanswerable questions too) and ROC AUC.

    python docs/study/crossfit-rule/compare.py A_DIR B_DIR   # B minus A
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from train.answerability.estimators import roc_auc
from train.experiments.article_stats import compare_by_article, describe


def main() -> int:
    a, b = (json.loads((Path(d) / "questions.json").read_text()) for d in sys.argv[1:3])
    assert [r["article"] for r in a] == [r["article"] for r in b]  # the same questions, in one order
    mixed = set(json.loads((Path(sys.argv[1]) / "crossfit.json").read_text())["mixed_articles"])
    for name, keep in (
        ("all articles", lambda r: True),
        (f"the {len(mixed)} mixed articles", lambda r: r["article"] in mixed),
    ):
        rows = [i for i, r in enumerate(a) if keep(r)]
        fa = np.array([a[i]["decided_f1"] for i in rows])
        fb = np.array([b[i]["decided_f1"] for i in rows])
        titles = [a[i]["article"] for i in rows]
        print(
            f"decided F1, {name}: {100 * fa.mean():.2f} -> {100 * fb.mean():.2f}; {describe(compare_by_article(fb, fa, titles))}"
        )
    labels = np.array([r["answerable"] for r in a])
    auc_a = roc_auc(np.array([r["answerable_prob"] for r in a]), labels)
    auc_b = roc_auc(np.array([r["answerable_prob"] for r in b]), labels)
    print(f"ROC AUC of P(answerable), all questions: {auc_a:.3f} -> {auc_b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
