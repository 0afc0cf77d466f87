"""`python -m train.study`: the whole recipe on this machine, end to end, with honest held-out scores.

A thin command: the flags and the work are `train.experiments.study`, which has no entry point of its
own, so this is the experiment's one name (its one-line errors and exit codes included)."""

import sys

from train.common.cli import run
from train.experiments.study import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(run(main, prog="train.study"))
