"""`python -m train.evaluate --checkpoint DIR --data FILE --out DIR`: official SQuAD 2.0 scores.

Writes predictions.json (id -> text, "" = no answer), na_probs.json, nbest.json and metrics.json
(exact, f1, HasAns_*, NoAns_*, best_exact/best_f1 and their thresholds). Window sizes and the
no-answer threshold default to what the checkpoint's metadata says (set by fine-tuning).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from train import checkpoint
from train.cli import Parser, run
from train.contract import DEFAULTS
from train.qa import run_evaluation, write_prediction_files
from train.squad import featurize, read_squad


def build_parser() -> Parser:
    p = Parser(prog="python -m train.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="fine-tuned QA checkpoint directory")
    p.add_argument("--data", required=True, help="SQuAD 2.0 JSON with answers")
    p.add_argument(
        "--out", required=True, help="directory for predictions.json, na_probs.json, nbest.json, metrics.json"
    )
    p.add_argument(
        "--threshold", type=float, default=None, help="no-answer probability threshold (default: metadata)"
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
    threshold = pick(args.threshold, "no_answer_threshold", 0.5)
    examples = read_squad(args.data)
    features = featurize(examples, loaded.tokenizer, **fkw)
    model = loaded.model.to(torch.device(args.device))
    result = run_evaluation(
        model,
        examples,
        features,
        threshold=threshold,
        batch_size=args.batch_size,
        device=args.device,
        n_best=args.n_best,
        max_answer_len=pick(args.max_answer_len, "max_answer_len", 30),
        progress=not args.no_progress,
    )
    write_prediction_files(args.out, result)
    print(json.dumps(result.metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.evaluate"))
