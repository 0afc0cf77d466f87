"""`python -m train.synth`: self-supervised SQuAD 2.0 questions from unlabelled text (torch-free).

A thin command: the flags and the work are `train.experiments.synth`, which has no entry point of its
own, so this is the experiment's one name (its one-line errors and exit codes included)."""

import sys

from train.common.cli import run
from train.experiments.synth import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(run(main, prog="train.synth"))
