"""`python -m train.sweep`: the fine-tuning trade-off study (CS293S: XLNet on limited hardware).

A thin command: the flags and the work are `train.experiments.sweep`, which has no entry point of its
own, so this is the experiment's one name (its one-line errors and exit codes included)."""

import sys

from train.common.cli import run
from train.experiments.sweep import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(run(main, prog="train.sweep"))
