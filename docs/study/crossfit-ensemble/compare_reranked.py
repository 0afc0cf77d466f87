"""Two refits of cross-fitted runs with the same questions compared on the re-ranked span alone: span F1
of the span the re-ranker puts first, on the answerable questions, question by question with articles as
the unit (the bootstrap, the t interval and the sign test).

    python docs/study/crossfit-ensemble/compare_reranked.py A_DIR B_DIR   # B minus A
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from train.experiments.article_stats import compare_by_article, describe


def main() -> int:
    a, b = (json.loads((Path(d) / "questions.json").read_text()) for d in sys.argv[1:3])
    assert [r["article"] for r in a] == [r["article"] for r in b]  # the same questions, in one order
    rows = [i for i, r in enumerate(a) if r["answerable"]]
    fa = np.array([a[i]["reranked_f1"] for i in rows])
    fb = np.array([b[i]["reranked_f1"] for i in rows])
    titles = [a[i]["article"] for i in rows]
    print(
        f"re-ranked span F1, {len(rows)} answerable questions: {100 * fa.mean():.2f} -> {100 * fb.mean():.2f}; "
        f"{describe(compare_by_article(fb, fa, titles))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
