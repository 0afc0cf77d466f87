"""The fold readers of two cross-fitted runs with the same folds as an ensemble: for each fold, the two
readers that never saw its articles (one per run) decode its questions together (their logits averaged,
as train.evaluate's ensembles do), and the re-ranker and the rule are refitted on those out-of-fold spans
as train.crossfit fits them (nested by fold). Its spans are kept (``OUT/fold-N/predictions.json``), so a
second call only refits.

    PYTHONPATH=. python docs/study/crossfit-ensemble/ensemble.py RUN_A RUN_B OUT [linear|trees]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from qa_core.squad import read_squad
from train.experiments.heldout import predict_files
from train.experiments.pipeline_crossfit import fit_and_report, load_outputs


def main() -> int:
    a, b, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    reranker = sys.argv[4] if len(sys.argv) > 4 else "trees"
    fold_of = json.loads((a / "folds.json").read_text())
    if json.loads((b / "folds.json").read_text()) != fold_of:
        raise SystemExit("the runs' folds differ: no reader of B is out of fold for A's fold")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(a / "folds.json", out / "folds.json")
    for f in range(max(fold_of.values()) + 1):
        folder = out / f"fold-{f}"
        folder.mkdir(exist_ok=True)
        shutil.copy(a / f"fold-{f}" / "heldout.json", folder / "heldout.json")
        kept = folder / "predictions.json"
        if not kept.exists():
            members = [a / f"fold-{f}" / "reader", b / f"fold-{f}" / "reader"]
            found = predict_files(members, read_squad(folder / "heldout.json"), progress=True).predictions
            tmp = kept.with_suffix(".tmp")
            tmp.write_text(json.dumps({q: p.to_dict() for q, p in found.items()}, ensure_ascii=False))
            tmp.replace(kept)  # whole or absent: an interrupted decode is done again
    examples, readers, _ = load_outputs(out)
    fit_and_report(examples, readers, fold_of, out, "mixed", reranker)
    print((out / "RESULTS.md").read_text().split("| article")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
