"""What every training recipe does the same way around its own work: its settings as a config dataclass
built from the parsed flags, and a :class:`Session` that opens the run (device, torchrun, the run
directory's record), resumes from the newest checkpoint, shows progress, writes checkpoints from the
main rank and closes the process group at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, TypeVar

import torch
import torch.distributed as dist
from tqdm import tqdm

from train.engine.execution import Dist, init_distributed
from train.engine.memory import gpu_peak_line
from train.engine.run_record import open_run
from train.engine.state import latest_checkpoint, load_training_state, save_training_state
from train.engine.step import TrainStep

C = TypeVar("C", bound="RunConfig")


@dataclass(kw_only=True)
class RunConfig:
    """The settings the engine itself reads: the run directory, how this invocation uses it, and where
    it runs. A recipe's config extends it with its own; each field is one command-line flag."""

    out: str
    resume: bool = False
    overwrite: bool = False
    stop_after: int | None = None
    no_progress: bool = False
    device: str = "auto"
    threads: int | None = None
    # the flags given on the command line (None from code: every setting counts in resume checks)
    explicit_flags: set[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace) -> C:
        """The config of parsed flags (the parser has one destination per field)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def defaults(cls) -> SimpleNamespace:
        """Each field's default (what the parser shows and uses); required fields have none."""
        fields = dataclasses.fields(cls)
        return SimpleNamespace(**{f.name: f.default for f in fields if f.default is not dataclasses.MISSING})


@dataclass(kw_only=True)
class TrainingConfig(RunConfig):
    """The settings both training recipes take under the same names, each one flag of
    :data:`train.engine.flags.SHARED_FLAGS`. A field without a default here is one whose default
    differs between the recipes: each recipe's config gives its own."""

    # where the model and its tokenizer come from
    init: str | None = None
    config: str | None
    spm: str | None = None
    train_spm: int | None = None
    dropout: float | None = None
    activation: str | None
    aoa: bool = False
    # optimisation
    steps: int | None
    batch_size: int = 8
    grad_accum: int | None
    lr: float
    warmup: int | None
    decay: str = "linear"
    min_lr_ratio: float = 0.0
    optimizer: str = "xlnet"
    weight_decay: float = 0.0
    adam_eps: float = 1e-6
    clip: float = 1.0
    precision: str = "fp32"
    activation_checkpointing: bool = False
    seed: int = 42
    # run
    log_every: int = 10
    save_every: int
    keep_last: int = 2

    # The counts a run divides by, loops over or slices with: below these it would crash mid-run or
    # silently do nothing. (--keep-last 0 keeps every checkpoint.) A recipe's config adds its own.
    AT_LEAST: ClassVar[dict[str, int]] = {
        "steps": 1,
        "batch_size": 1,
        "grad_accum": 1,
        "warmup": 0,
        "log_every": 1,
        "save_every": 1,
        "keep_last": 0,
        "stop_after": 1,
        "threads": 1,
    }

    def __post_init__(self) -> None:
        if self.spm and self.train_spm:
            raise ValueError("give either --spm or --train-spm, not both")
        for name, least in self.AT_LEAST.items():
            value = getattr(self, name, None)
            if value is not None and value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")


@dataclass(frozen=True)
class Resumed:
    """The checkpoint a run continues from and what it held besides the weights and optimizer."""

    path: Path
    step: int
    data: Any
    extra: dict


@dataclass
class Session:
    """One invocation of a recipe: where it runs and the run directory it trains into."""

    dist: Dist
    out: Path

    @classmethod
    def open(cls, command: str, config: C, validate: Callable[[C], None] | None = None) -> tuple[Session, C]:
        """Start torchrun's process group (if any) and the run directory's record (see
        :func:`train.engine.run_record.open_run`); returns the session and the config to run with
        (on ``--resume``, the recorded settings)."""
        d = init_distributed(config.device)
        if config.threads:
            torch.set_num_threads(config.threads)
        out = Path(config.out)
        return cls(d, out), open_run(out, command, config, d, validate=validate)

    def resume(self, config: RunConfig, model, optimizer, scheduler) -> Resumed | None:
        """On ``--resume``, restore the newest checkpoint's weights, optimizer, scheduler and RNG."""
        path = latest_checkpoint(self.out) if config.resume else None
        if path is None:
            return None
        state = load_training_state(path, model, optimizer, scheduler)
        return Resumed(path, state["step"], state["data"], state["extra"])

    def train_step(self, model, optimizer, scheduler, config, resumed: Resumed | None) -> TrainStep:
        """The optimizer step the config describes, with a resumed run's loss scale and skip counts."""
        trainer_state = resumed.extra.get("trainer") if resumed is not None else None
        return TrainStep.from_args(model, optimizer, scheduler, self.dist, config, trainer_state)

    def progress(self, total: int, initial: int, config: RunConfig) -> tqdm:
        return tqdm(
            total=total,
            initial=initial,
            disable=not self.dist.is_main or config.no_progress,
            dynamic_ncols=True,
        )

    def save_state(self, step: int, trainer: TrainStep, *, extra: dict | None = None, **kw: Any) -> None:
        """A resumable checkpoint written by the main rank (``extra`` beside the step's own state; the
        rest as :func:`train.engine.state.save_training_state`); no rank runs ahead of it."""
        if self.dist.is_main:
            save_training_state(
                self.out,
                step,
                trainer.model,
                trainer.optimizer,
                trainer.scheduler,
                extra={**(extra or {}), "trainer": trainer.state_dict()},
                **kw,
            )
        self.barrier()

    def barrier(self) -> None:
        if self.dist.enabled:
            dist.barrier()

    def close(self) -> None:
        """Report the GPU memory peak of a run on CUDA (main rank), then end torchrun's process group once
        every rank is done."""
        peak = gpu_peak_line(self.dist.device)
        if peak and self.dist.is_main:
            print(peak, flush=True)
        if self.dist.enabled:
            dist.barrier()
            dist.destroy_process_group()
