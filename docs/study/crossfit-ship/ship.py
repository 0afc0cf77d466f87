"""Put the cross-fit's shipped reader (``train.crossfit --final --final-hold-out ...``) into models/ as an
int8 export, with its provenance, its held-out questions and the demo's.

Run by run.sh after the cross-fit, ``train.rerank_report`` on the held-out articles and ``export.onnx``.
Every number written here is read from those runs' files; the demo's answers are asked of the shipped
files through the real server, as ``make demo`` asks them. The reader trained on every labelled article
but the held-out ones; its re-ranker and rule were fitted on the fold readers' out-of-fold outputs for
those same articles (each from a reader that never saw that article), so "calibration" here names the
articles whose out-of-fold outputs fitted the rule, not articles the reader never trained on.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))


def _reader_v3_ship():
    """reader-v3's ship.py: its helpers (titles, the run script's commands, the demo's questions) are
    this one's too."""
    spec = importlib.util.spec_from_file_location("reader_v3_ship", REPO / "docs/study/reader-v3/ship.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    v3 = _reader_v3_ship()
    args = v3.parse_args("--crossfit")
    out: Path = args.out
    folder = args.checkpoint.parent  # final-holdout-<hash>/: train.json, heldout.json, reader/
    report, meta, config, sidecar = v3.read_run(args)
    synth = json.loads((Path(meta["init"]) / "metadata.json").read_text())  # the stage it started from
    answerability = meta["answerability"]
    fitted_on = answerability["report"]["fitted_on"]
    v3.place_files(args.export, folder / "heldout.json", args.demo_articles.split(","), out)
    fine_tuned = v3.titles(folder / "train.json")
    provenance = {
        "name": out.name,
        "what": (
            f"An int8 ONNX export of the cross-fit's shipped reader (random init -> {synth['step']:,} steps "
            f"on synthetic questions from the unlabelled articles -> {meta['step']:,} steps of "
            f"fine-tuning on {len(fine_tuned)} labelled SQuAD 2.0 articles; small preset, shallow head), seed 0, "
            "with a span re-ranker and the decision rule fitted on the out-of-fold outputs of 4 fold readers "
            "(each article's outputs from a reader that never trained on it). Trained on 2 CPU cores."
        ),
        "made": datetime.date.today().isoformat(),
        "commands": v3.run_commands(Path(__file__).parent / "run.sh", args.crossfit, args.checkpoint),
        "data": {
            "labelled": "SQuAD 2.0 dev, the 13-article cut dev-v2.0.cs224n-13.json, and the first 10 articles of "
            "the official training set, train-v2.0.first10.json (CC BY-SA 4.0, Rajpurkar et al. 2018)",
            "unlabelled": "test-v2.0.cs224n.json (20 articles, text only): the synthetic questions' contexts",
        },
        "articles": {
            "fine_tuned": fine_tuned,
            "calibration": sorted(fitted_on["out_of_fold"]["rule_articles"]),
            "calibration_out_of_fold": True,
            "held_out": v3.titles(folder / "heldout.json"),
        },
        **v3.model_fields(meta, config),
        "reranker": {"top_k": answerability["reranker"]["top_k"], "fitted_on": fitted_on["out_of_fold"]},
        "int8_agreement": v3.int8_agreement(sidecar),
        "held_out": {
            **v3.held_out_scores(report),
            "note": "scored with the PyTorch fp32 checkpoint; the int8 export's agreement with it is int8_agreement. "
            "The fold readers whose out-of-fold outputs fitted the rule trained on the held-out articles "
            "(a second-order influence on the rule, none on the reader)",
            "study_report": "docs/study/crossfit-ship/ (RESULTS.md; rerank/ for the re-ranker and the rule)",
        },
    }
    print(v3.write_provenance(out, provenance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
