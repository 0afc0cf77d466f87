"""Refit stage 3 of a finished `train.crossfit` run (its readers' out-of-fold spans are kept), with the
answerability features as they were before issue 59 added four (``--features before``) or as they are,
and the rule fitted on every article or on those holding unanswerable questions too.

    python docs/study/crossfit-rule/refit.py RUN {before,now} {all,mixed} OUT

"before": the question verifier reads the first 14 question features and the span-F1 model the first
3 span features (the lists as they stood at 0da9f8e); nothing else differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import train.answerability.estimators as estimators
import train.answerability.table as table
from qa_core.squad import answerability_features as features
from train.experiments.pipeline_crossfit import fit_and_report, load_outputs

BEFORE_QUESTION_FEATURES = features.QUESTION_FEATURES[:14]
BEFORE_SPAN_FEATURES = features.SPAN_FEATURES[:3]


def main() -> int:
    run, which, rule_articles, out = sys.argv[1:5]
    if which == "before":
        estimators.QUESTION_FEATURES = table.QUESTION_FEATURES = BEFORE_QUESTION_FEATURES
        span_f1 = ("span_log_prob", "span_top_prob", *BEFORE_SPAN_FEATURES)
        estimators.SPAN_F1_FEATURES = table.SPAN_F1_FEATURES = span_f1
    elif which != "now":
        raise SystemExit("features: before or now")
    examples, readers, fold_of = load_outputs(Path(run))
    fit_and_report(examples, readers, fold_of, Path(out), rule_articles)
    print((Path(out) / "RESULTS.md").read_text().split("| article")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
