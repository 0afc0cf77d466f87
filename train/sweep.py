"""`python -m train.experiments.sweep`, the documented name of `train.experiments.sweep`."""

from train.experiments.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())
