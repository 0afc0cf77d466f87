"""The shipped export with its linear re-ranker swapped for boosted trees fitted on the 1,600-step
cross-fit's out-of-fold spans: a model to time decoding with trees (its answers are not a claim)."""
import json, shutil, sys
from pathlib import Path
from train.experiments.pipeline_crossfit import load_outputs
from train.answerability.rerank_fit import fit_reranker
src, out = Path("models/squad2-small-int8"), Path(sys.argv[1])
if out.exists(): shutil.rmtree(out)
shutil.copytree(src, out)
examples, readers, _ = load_outputs(Path("runs/crossfit-4fold-1600"))
every = [ex for f in sorted(examples) for ex in examples[f]]
preds = {q: p for f in readers for q, p in readers[f].items()}
r = fit_reranker(every, preds, model="trees")
meta = json.loads((out / "export.json").read_text())
meta["answerability"]["reranker"] = r.to_dict()
(out / "export.json").write_text(json.dumps(meta, indent=1))
print(r.summary()[:200], len(r.model.trees))
