"""Two cross-fitted runs with the same folds and synthetic stage, compared by their readers alone: span F1 of
each reader's best span on its held-out answerable questions, per article, for the folds both runs have
finished (their kept ``fold-N/predictions.json``), articles as the unit.

    python docs/study/crossfit-steps/compare_readers.py RUN_A RUN_B   # B minus A
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from qa_core.squad import read_squad
from train.experiments.article_stats import compare_by_article, describe
from train.squad.metrics import best_exact_f1


def main() -> int:
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    if json.loads((a / "folds.json").read_text()) != json.loads((b / "folds.json").read_text()):
        raise SystemExit("the runs' folds differ: nothing to pair")
    f1a, f1b, titles, folds = [], [], [], []
    for fold in range(100):
        pa, pb = a / f"fold-{fold}" / "predictions.json", b / f"fold-{fold}" / "predictions.json"
        if not (pa.exists() and pb.exists()):
            continue
        da, db = json.loads(pa.read_text()), json.loads(pb.read_text())
        folds.append(fold)
        for ex in read_squad(a / f"fold-{fold}" / "heldout.json"):
            if not ex.answers:
                continue
            best = [(d[ex.qas_id]["n_best"] or [{"text": ""}])[0]["text"] for d in (da, db)]
            f1a.append(best_exact_f1(ex.answer_texts, best[0])[1])
            f1b.append(best_exact_f1(ex.answer_texts, best[1])[1])
            titles.append(ex.title)
    if not titles:
        raise SystemExit("no fold finished in both runs")
    x, y = np.array(f1a), np.array(f1b)
    print(f"folds {folds}: {len(set(titles))} articles, {len(titles)} answerable questions")
    print(
        f"reader span F1 {100 * x.mean():.2f} -> {100 * y.mean():.2f}; {describe(compare_by_article(y, x, titles))}"
    )
    for t in sorted(set(titles)):
        rows = [i for i, s in enumerate(titles) if s == t]
        print(f"  {t}: {100 * x[rows].mean():.2f} -> {100 * y[rows].mean():.2f} ({len(rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
