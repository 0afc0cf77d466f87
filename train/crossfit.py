"""`python -m train.crossfit`: every labelled article scored by a pipeline that never saw it.

A thin command: the flags and the work are `train.experiments.pipeline_crossfit`, which has no entry point of its
own, so this is the experiment's one name (its one-line errors and exit codes included)."""

import sys

from train.common.cli import run
from train.experiments.pipeline_crossfit import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(run(main, prog="train.crossfit"))
