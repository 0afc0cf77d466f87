"""`python -m train.experiments.study`, the documented name of `train.experiments.study`."""

from train.experiments.study import main

if __name__ == "__main__":
    raise SystemExit(main())
