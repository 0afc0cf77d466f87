"""`python -m train.ablation`, the documented name of `train.experiments.ablation`: runs that module as the
program, so its one-line errors and exit codes are the same under either name."""

import runpy

if __name__ == "__main__":
    runpy.run_module("train.experiments.ablation", run_name="__main__", alter_sys=True)
