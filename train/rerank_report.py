"""`python -m train.rerank_report`: the span re-ranker on vs off, and the stored rule, on held-out articles.

A thin command: the flags and the work are `train.experiments.rerank_report`, which has no entry point of its
own, so this is the experiment's one name (its one-line errors and exit codes included)."""

import sys

from train.common.cli import run
from train.experiments.rerank_report import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(run(main, prog="train.rerank_report"))
