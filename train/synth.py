"""`python -m train.experiments.synth`, the documented name of `train.experiments.synth`."""

from train.experiments.synth import main

if __name__ == "__main__":
    raise SystemExit(main())
