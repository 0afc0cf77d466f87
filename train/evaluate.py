"""`python -m train.evaluate --checkpoint DIR --data FILE --out DIR`: official SQuAD 2.0 scores.

Writes predictions.json (id -> text, "" = no answer), na_probs.json, decisions.json (calibrated
P(answerable), the threshold each question was decided at, the best span), nbest.json and
metrics.json (exact, f1, HasAns_*, NoAns_*, best_exact/best_f1 and their thresholds). Window sizes
and the answerability model (verifier, calibration and decision rule, or a plain no-answer
threshold) default to what the checkpoint's metadata says (set by fine-tuning or `train.calibrate`).
Articles the checkpoint was fine-tuned on, or whose questions chose its no-answer decision, make the
scores in-sample: one warning line each on stderr, and ``in_sample`` in metrics.json.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from train.common.cli import Parser, run
from train.common.contract import DEFAULTS
from train.engine.predict import run_evaluation, write_prediction_files
from train.model import checkpoint
from train.squad import featurize, read_squad
from train.squad.answerability import from_metadata as answerability_from_metadata
from train.squad.provenance import in_sample_warnings


def build_parser() -> Parser:
    p = Parser(prog="python -m train.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="fine-tuned QA checkpoint directory")
    p.add_argument("--data", required=True, help="SQuAD 2.0 JSON with answers")
    p.add_argument(
        "--out", required=True, help="directory for predictions.json, na_probs.json, nbest.json, metrics.json"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="no-answer probability threshold, replacing the stored decision rule (default: metadata)",
    )
    p.add_argument(
        "--answerability",
        choices=("stored", "cls"),
        default="stored",
        help="stored: the checkpoint's fitted answerability model (if any); cls: sigmoid(cls_logit) against "
        "the stored no_answer_threshold, ignoring a fitted model",
    )
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--doc-stride", type=int, default=None)
    p.add_argument("--max-query-len", type=int, default=None)
    p.add_argument("--max-answer-len", type=int, default=None)
    p.add_argument("--n-best", type=int, default=DEFAULTS.n_best)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        raise ValueError(f"--threshold must be a probability in [0, 1], got {args.threshold}")
    loaded = checkpoint.load(args.checkpoint)
    if not loaded.kind.startswith("qa:"):
        raise ValueError(
            f"{args.checkpoint} holds a {loaded.kind!r} model, not a QA model; fine-tune it first"
        )
    if loaded.tokenizer is None:
        raise ValueError(f"{args.checkpoint} has no spiece.model")
    meta = loaded.metadata
    pick: Callable[[Any, str, Any], Any] = lambda v, key, default: (  # noqa: E731
        v if v is not None else meta.get(key, default)
    )
    fkw = {
        "max_seq_len": pick(args.max_seq_len, "max_seq_len", 384),
        "doc_stride": pick(args.doc_stride, "doc_stride", 128),
        "max_query_len": pick(args.max_query_len, "max_query_len", 64),
    }
    stored = (
        meta if args.answerability == "stored" else {k: v for k, v in meta.items() if k != "answerability"}
    )
    answerability = answerability_from_metadata(stored)
    examples = read_squad(args.data)
    warnings = in_sample_warnings(meta, answerability, examples, own_threshold=args.threshold is not None)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    features = featurize(examples, loaded.tokenizer, **fkw)
    model = loaded.model.to(torch.device(args.device))
    result = run_evaluation(
        model,
        examples,
        features,
        threshold=args.threshold,
        answerability=answerability,
        batch_size=args.batch_size,
        device=args.device,
        n_best=args.n_best,
        max_answer_len=pick(args.max_answer_len, "max_answer_len", 30),
        progress=not args.no_progress,
    )
    result.metrics["in_sample"] = warnings
    write_prediction_files(args.out, result)
    print(json.dumps(result.metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.evaluate"))
