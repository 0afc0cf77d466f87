"""`python -m train.experiments.ablation`, the documented name of `train.experiments.ablation`."""

from train.experiments.ablation import main

if __name__ == "__main__":
    raise SystemExit(main())
