"""`python -m train.ablation`: activation / Attention-on-Attention grid at equal budget and seeds.

A thin command: the flags and the work are `train.experiments.ablation`, which has no entry point of its
own, so this is the experiment's one name (its one-line errors and exit codes included)."""

import sys

from train.common.cli import run
from train.experiments.ablation import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(run(main, prog="train.ablation"))
