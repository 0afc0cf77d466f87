"""The shipped export with its linear re-ranker swapped for boosted trees fitted on the 1,600-step
cross-fit's out-of-fold spans: a model to time decoding with trees (its answers are not a claim).

    PYTHONPATH=. python docs/bench/reranker-trees/make_trees_model.py OUT_DIR
"""

import json
import shutil
import sys
from pathlib import Path

from train.answerability.rerank_fit import fit_reranker
from train.experiments.pipeline_crossfit import load_outputs


def main() -> None:
    src, out = Path("models/squad2-small-int8"), Path(sys.argv[1])
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    examples, readers, _ = load_outputs(Path("runs/crossfit-4fold-1600"))
    every = [ex for f in sorted(examples) for ex in examples[f]]
    predictions = {q: p for f in readers for q, p in readers[f].items()}
    reranker = fit_reranker(every, predictions, model="trees")
    meta = json.loads((out / "export.json").read_text())
    meta["answerability"]["reranker"] = reranker.to_dict()
    (out / "export.json").write_text(json.dumps(meta, indent=1))
    print(reranker.summary())


if __name__ == "__main__":
    main()
