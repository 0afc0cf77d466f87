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
from train.common.dataclass_flags import add_flags, options_from
from train.evaluation.options import EvaluationOptions
from train.evaluation.predict import evaluate_checkpoint


def build_parser() -> Parser:
    """One flag per field of :class:`EvaluationOptions` (its type, default and help)."""
    p = Parser(prog="python -m train.evaluate", description=__doc__.splitlines()[0])
    add_flags(p, EvaluationOptions)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    result = evaluate_checkpoint(options_from(EvaluationOptions, build_parser().parse_args(argv)))
    print(json.dumps(result.metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.evaluate"))
