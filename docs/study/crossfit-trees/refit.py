"""Refit stage 3 of a finished `train.crossfit` run (its readers' out-of-fold spans are kept) with the
span re-ranker as boosted trees instead of the linear model; the rule on the mixed articles, as the
default. No reader is run.

    PYTHONPATH=. python docs/study/crossfit-trees/refit.py RUN OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

from train.experiments.pipeline_crossfit import fit_and_report, load_outputs


def main() -> int:
    run, out = Path(sys.argv[1]), Path(sys.argv[2])
    examples, readers, fold_of = load_outputs(run)
    fit_and_report(examples, readers, fold_of, out, "mixed", "trees")
    print((out / "RESULTS.md").read_text().split("| article")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
