"""`python -m train.calibrate --checkpoint DIR --data HELD_OUT.json`: fit a QA model's answerability.

For a fine-tuned checkpoint (ours, or an older one that decides by a plain threshold): predicts the
labelled held-out questions of ``--data`` (articles the model never trained on, e.g. the official
dev file), fits the answerability model on them by cross-fitting over articles
(:mod:`train.answerability.fit`: a question verifier from ``--train-file``, combined with the model's
scores, calibrated, and a decision rule chosen by cross-validation) and stores it in the checkpoint's
``metadata.json``, where `train.evaluate`, the exporters and the server read it. Fine-tuning does the
same at its end on its ``--dev-file``; this command redoes it on other data. Score the result on yet
other articles: the numbers fitted here must not be judged on the questions they were fitted on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from qa_core.squad import VERIFIER_LOGIT, read_squad
from qa_core.squad.answerability import from_metadata
from train.answerability.fit import ANSWERABILITY_CHOICES, CALIBRATION_METHODS, FEATURE_SETS, fit_for
from train.answerability.rerank_fit import RERANK_MODELS, RERANKER_HELP
from train.common.atomic_dir import atomic_write_text
from train.common.cli import Parser, run
from train.evaluation.predict import predict_checkpoint
from train.model import checkpoint

CHOICES = tuple(c for c in ANSWERABILITY_CHOICES if c != "cls")


def build_parser() -> Parser:
    p = Parser(prog="python -m train.calibrate", description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint", required=True, help="fine-tuned QA checkpoint directory (updated in place)"
    )
    p.add_argument(
        "--data", required=True, help="labelled SQuAD 2.0 file of articles the model never trained on"
    )
    p.add_argument("--train-file", help="the fine-tuning questions, for the question verifier (verifier*)")
    p.add_argument("--answerability", choices=CHOICES, default="auto", help="as train.finetune's")
    p.add_argument("--calibration", choices=CALIBRATION_METHODS, default="platt")
    p.add_argument(
        "--no-rerank",
        dest="rerank",
        action="store_false",
        help="fit no span re-ranker: the rule decides on the reader's own best span",
    )
    p.add_argument("--reranker", choices=RERANK_MODELS, default="linear", help=RERANKER_HELP)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dry-run", action="store_true", help="report only; leave metadata.json as it is")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (
        args.answerability == "auto" or VERIFIER_LOGIT in FEATURE_SETS[args.answerability]
    ) and not args.train_file:
        raise ValueError(
            f"--answerability {args.answerability} needs --train-file (the fine-tuning questions)"
        )
    loaded = checkpoint.load(args.checkpoint)
    if not loaded.kind.startswith("qa:") or loaded.tokenizer is None:
        raise ValueError(f"{args.checkpoint}: not a fine-tuned QA checkpoint with its spiece.model")
    meta = dict(loaded.metadata)
    from_metadata(meta)  # a malformed stored model is reported before any work
    examples = read_squad(args.data)
    # decided by the default rule: the reader's own span order, which a re-ranker is fitted on
    predictions = predict_checkpoint(loaded, examples, args.batch_size, progress=not args.no_progress)
    train_examples = read_squad(args.train_file) if args.train_file else []
    a = fit_for(
        args.answerability,
        train_examples,
        examples,
        predictions,
        args.calibration,
        args.rerank,
        reranker_model=args.reranker,
    )
    a.report["fitted_on"]["file"] = str(args.data)
    if "verifier" in a.report:
        a.report["verifier"]["file"] = str(args.train_file)
    print(json.dumps(a.report, indent=2))
    if a.reranker is not None:
        print(a.reranker.summary())
    print(f"answerability: {a.report['decision']}")
    if not args.dry_run:
        meta["answerability"] = a.to_dict()
        atomic_write_text(Path(args.checkpoint) / "metadata.json", json.dumps(meta, indent=2, sort_keys=True))
        print(f"stored in {Path(args.checkpoint) / 'metadata.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.calibrate"))
