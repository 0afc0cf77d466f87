"""`python -m train.evaluate --checkpoint DIR --data FILE --out DIR`: official SQuAD 2.0 scores.

Writes predictions.json (id -> text, "" = no answer), na_probs.json, decisions.json (calibrated
P(answerable), the threshold each question was decided at, the best span), nbest.json and
metrics.json (exact, f1, HasAns_*, NoAns_*, best_exact/best_f1 and their thresholds). Window sizes
and the answerability model (verifier, calibration and decision rule, or a plain no-answer
threshold) default to what the checkpoint's metadata says (set by fine-tuning or `train.calibrate`).
Articles the checkpoint was fine-tuned on, or whose questions chose its no-answer decision, make the
scores in-sample: one warning line each on stderr, and ``in_sample`` in metrics.json. The work is
:func:`train.evaluation.predict.evaluate_checkpoint`; this module parses the flags and prints the metrics.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from train.common.cli import Parser, run
from train.evaluation.predict import evaluate_checkpoint


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
    p.add_argument("--n-best", type=int, default=None, help="default: the checkpoint's (its metadata)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = evaluate_checkpoint(
        args.checkpoint,
        args.data,
        args.out,
        threshold=args.threshold,
        answerability=args.answerability,
        max_seq_len=args.max_seq_len,
        doc_stride=args.doc_stride,
        max_query_len=args.max_query_len,
        max_answer_len=args.max_answer_len,
        n_best=args.n_best,
        batch_size=args.batch_size,
        device=args.device,
        progress=not args.no_progress,
    )
    print(json.dumps(result.metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.evaluate"))
