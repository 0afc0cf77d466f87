"""Put the study's int8 export into models/ with its provenance, its held-out questions and the demo's.

Run by run.sh after the study, `train.calibrate`, `train.rerank_report` and `export.onnx`. Every number
written here is read from those runs' files; the demo's answers are asked of the shipped files through
the real server, as `make demo` asks them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

import demo  # noqa: E402
from qa_core.squad import read_squad  # noqa: E402
from train.squad.metrics import best_exact_f1  # noqa: E402

SHIPPED_FILES = ("model.onnx", "export.json", "spiece.model", "tokenizer_config.json")


def titles(path: Path) -> list[str]:
    return sorted({ex.title for ex in read_squad(path)})


def run_commands(script: Path, study: Path, checkpoint: Path) -> list[str]:
    """The commands of run.sh, one line each, its variables written out."""
    text = script.read_text().replace("\\\n", " ")
    subs = {"$PY": "python", "$CK": str(checkpoint), "$RUN": str(study)}
    out = []
    for line in text.splitlines():
        if " -m " in line or "ship.py" in line:
            for var, value in subs.items():
                line = line.replace(var, value)
            out.append(" ".join(line.split()))
    return out


def demo_questions(heldout: dict, wanted: list[str]) -> dict:
    """The first paragraph of each named held-out article, with every question it has."""
    data = []
    for article in heldout["data"]:
        if article["title"] in wanted:
            data.append({"title": article["title"], "paragraphs": article["paragraphs"][:1]})
    return {
        "version": "v2.0",
        "source": "SQuAD 2.0 dev (CC BY-SA 4.0, Rajpurkar et al. 2018): the first paragraph of "
        f"{len(data)} of the model's held-out articles, with every question",
        "data": data,
    }


AGREEMENT_FIELDS = (
    "questions",
    "identical_answers",
    "identical_best_span",
    "identical_no_answer_decision",
    "either_answered",
    "identical_answers_where_either_answers",
    "best_span_changes",
    "best_span_changes_at_near_ties",
)


def int8_agreement(sidecar: dict) -> dict:
    """The export's agreement with its checkpoint on the held-out questions, as the provenance keeps it."""
    return {k: sidecar["agreement"][k] for k in AGREEMENT_FIELDS}


def held_out_scores(report: dict) -> dict:
    """The held-out articles' scores from ``train.rerank_report``'s rerank.json."""
    span, decision = report["span_f1"], report["decision"]
    return {
        "articles": report["articles"],
        "questions": report["questions"],
        "answerable": report["answerable"],
        "f1": decision["f1"],
        "exact": decision["exact"],
        "none_f1": decision["none_f1"],
        "answered": decision["answered"],
        "roc_auc": decision["roc_auc"],
        "span_f1": span["reranked"],
        "span_exact": report["reranked_span_exact"],
        "reader_span_f1": span["reader"],
    }


def place_files(export: Path, heldout_file: Path, demo_articles: list[str], out: Path) -> None:
    """``out`` emptied, then the export's files, every held-out question and the demo's questions."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    for name in SHIPPED_FILES:
        shutil.copy2(export / name, out / name)
    heldout = json.loads(heldout_file.read_text())
    heldout["source"] = (
        "SQuAD 2.0 dev (CC BY-SA 4.0, Rajpurkar et al. 2018): every question of the held-out articles"
    )
    (out / "heldout.json").write_text(json.dumps(heldout, ensure_ascii=False) + "\n")
    questions = demo_questions(heldout, demo_articles)
    (out / "questions.json").write_text(json.dumps(questions, indent=1, ensure_ascii=False) + "\n")


def write_provenance(out: Path, provenance: dict) -> str:
    """provenance.json, with the demo's answers as the shipped files give them through the real server
    (what tests/test_shipped_model.py holds them to); returns the demo's text."""
    (out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    text, answers = demo.ask_shipped(out)
    right = int(
        sum(
            best_exact_f1(ex.answer_texts, answers[ex.qas_id])[0] for ex in read_squad(out / "questions.json")
        )
    )
    provenance["demo"] = {"right": right, "answers": answers}
    (out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    return text


def parse_args(run_flag: str) -> argparse.Namespace:
    """The ship scripts' flags: where the run is (``run_flag``), its checkpoint, export and report."""
    p = argparse.ArgumentParser()
    for flag in (run_flag, "--checkpoint", "--export", "--report", "--out"):
        p.add_argument(flag, required=True, type=Path)
    p.add_argument("--demo-articles", required=True)
    return p.parse_args()


def read_run(args: argparse.Namespace) -> tuple[dict, dict, dict, dict]:
    """The report, the checkpoint's metadata and config, and the export's sidecar."""
    report = json.loads(args.report.read_text())
    meta = json.loads((args.checkpoint / "metadata.json").read_text())
    config = json.loads((args.checkpoint / "config.json").read_text())
    return report, meta, config, json.loads((args.export / "export.json").read_text())


def model_fields(meta: dict, config: dict) -> dict:
    """What the provenance says of the model: seed, shape, head, windows and its decision rule."""
    return {
        "seed": 0,
        "model": {
            k: config[k] for k in ("d_model", "n_layer", "vocab_size", "n_head", "d_inner", "ff_activation")
        },
        "head": meta["head"],
        "windows": {"max_seq_len": meta["max_seq_len"], "doc_stride": meta["doc_stride"]},
        "answerability": (meta["answerability"].get("report") or {}).get("decision"),
    }


def main() -> int:
    args = parse_args("--study")
    out: Path = args.out
    report, meta, config, sidecar = read_run(args)
    answerability = meta["answerability"]
    reranker = answerability["reranker"]
    place_files(args.export, args.study / "eval.json", args.demo_articles.split(","), out)
    provenance = {
        "name": out.name,
        "what": "An int8 ONNX export of the reader-v3 recipe (random init -> 3,000 steps on synthetic questions, "
        "4 per sentence -> 3,000 steps of fine-tuning on the 10 SQuAD 2.0 training articles and 5 labelled dev "
        "articles; small preset, shallow head), seed 0, with a span re-ranker and the guarded decision rule "
        "fitted on 5 other articles. Trained on 2 CPU cores.",
        "made": datetime.date.today().isoformat(),
        "commands": run_commands(Path(__file__).parent / "run.sh", args.study, args.checkpoint),
        "data": {
            "labelled": "SQuAD 2.0 dev, the 13-article cut dev-v2.0.cs224n-13.json, and the first 10 articles of "
            "the official training set, train-v2.0.first10.json (CC BY-SA 4.0, Rajpurkar et al. 2018)",
            "unlabelled": "test-v2.0.cs224n.json (20 articles, text only): the synthetic questions' contexts",
        },
        "articles": {
            "fine_tuned": titles(args.study / "fit.json"),
            "calibration": titles(args.study / "calibration.json"),
            "held_out": titles(args.study / "eval.json"),
        },
        **model_fields(meta, config),
        "reranker": {
            "top_k": reranker["top_k"],
            "cross_fitted_on_calibration": reranker["report"]["cross_fitted"],
        },
        "int8_agreement": int8_agreement(sidecar),
        "held_out": {
            **held_out_scores(report),
            "note": "scored with the PyTorch fp32 checkpoint; the int8 export's agreement with it is int8_agreement",
            "study_report": "docs/study/reader-v3/ (the study's RESULTS.md, rerank/ for the re-ranker and the rule)",
        },
    }
    print(write_provenance(out, provenance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
