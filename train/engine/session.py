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

from train.common.dataclass_flags import FLAG_KEY, flag, flat_settings, nested_value, split_nested
from train.engine.execution import Dist, init_distributed
from train.engine.memory import gpu_peak_line
from train.engine.optim import DECAYS, OPTIMIZERS
from train.engine.run_record import open_run
from train.engine.state import latest_checkpoint, load_training_state, save_training_state
from train.engine.step import TRAINING_PRECISIONS, TrainStep
from train.model import ACTIVATIONS, PRESETS

C = TypeVar("C", bound="RunConfig")


@dataclass(kw_only=True)
class RunConfig:
    """The settings the engine itself reads: the run directory, how this invocation uses it, and where
    it runs. A recipe's config extends it with its own; each field is one command-line flag
    (:mod:`train.common.dataclass_flags`), its help beside it."""

    out: str = flag(help="run directory: checkpoints, metrics.jsonl, plots, and the final model")
    resume: bool = flag(
        False, help="continue the run in --out from its newest checkpoint, with its recorded settings"
    )
    overwrite: bool = flag(False, help="replace another run's checkpoints in --out (else refused)")
    stop_after: int | None = flag(
        None,
        help="exit (with a checkpoint) after this many steps of this invocation, as Ctrl-C would; --resume continues",
    )
    no_progress: bool = flag(False, help="no progress bar")
    device: str = flag("auto", help="auto, cpu or cuda")
    threads: int | None = flag(None, help="torch intra-op threads (default: torch's choice)")
    # the flags given on the command line (None from code: every setting counts in resume checks)
    explicit_flags: set[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace) -> C:
        """The config of parsed flags (the parser has one destination per field, or per field of a
        nested settings value such as a model's :class:`~qa_core.contract.ModelSettings`)."""
        values = {}
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(FLAG_KEY)
            values[f.name] = nested_value(f, args) if spec and spec.nested else getattr(args, f.name)
        return cls(**values)

    @classmethod
    def of(cls: type[C], **settings: Any) -> C:
        """The config of flat settings, named as the flags are (``max_seq_len`` goes into ``model``)."""
        return cls(**split_nested(cls, settings))

    @classmethod
    def defaults(cls) -> SimpleNamespace:
        """Each field's default (what the parser shows and uses); required fields have none."""
        fields = dataclasses.fields(cls)
        return SimpleNamespace(**{f.name: f.default for f in fields if f.default is not dataclasses.MISSING})


@dataclass(kw_only=True)
class TrainingConfig(RunConfig):
    """The settings both training recipes take under the same names, each one flag. A field without a
    default here is one whose default differs between the recipes: each recipe's config gives its own
    (and may say more in its help)."""

    # where the model and its tokenizer come from
    init: str | None = flag(None, help="start from this checkpoint: ours or a HuggingFace XLNet directory")
    config: str | None = flag(choices=sorted(PRESETS), help="random init of this model size preset")
    spm: str | None = flag(None, help="sentencepiece model to use (spiece.model or a directory holding one)")
    train_spm: int | None = flag(
        None, metavar="VOCAB_SIZE", help="train a sentencepiece model of this size on the data"
    )
    dropout: float | None = flag(None, help="override the preset's dropout")
    activation: str | None = flag(choices=ACTIVATIONS, help="feed-forward activation (random init)")
    aoa: bool = flag(False, help="Attention-on-Attention in every layer (random init)")
    # optimisation
    steps: int | None = flag(help="optimizer steps")
    batch_size: int = flag(8, help="examples per micro-batch per rank")
    grad_accum: int | None = flag(help="micro-batches per optimizer step")
    lr: float = flag(help="peak learning rate")
    warmup: int | None = flag(help="linear warmup steps")
    decay: str = flag("linear", choices=DECAYS, help="learning-rate decay after the warmup")
    min_lr_ratio: float = flag(
        0.0, help="final lr as a fraction of the peak (the original's pretraining: 0.001)"
    )
    optimizer: str = flag("xlnet", choices=OPTIMIZERS, help="xlnet (the original's Adam) or adamw")
    weight_decay: float = flag(0.0, help="weight decay (the original's SQuAD runs and train_gpu.py: 0)")
    adam_eps: float = flag(1e-6, help="Adam's epsilon")
    clip: float = flag(1.0, help="gradient global-norm clip (0 = off)")
    precision: str = flag(
        "fp32",
        choices=TRAINING_PRECISIONS,
        help="autocast precision (fp16: CUDA only, with a gradient scaler)",
    )
    activation_checkpointing: bool = flag(
        False,
        help="keep each layer's inputs only and recompute the layer in backward: far less activation "
        "memory for one more forward pass per step, same gradients",
    )
    seed: int = flag(42, help="seeds every RNG (data order, dropout, initialisation)")
    # run
    log_every: int = flag(10, help="log a metrics line every N steps")
    save_every: int = flag(help="write a checkpoint every N steps")
    keep_last: int = flag(2, help="step checkpoints to keep (0: all)")

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
    # Bounds a recipe's config puts on what the model it writes may record (its readers refuse more).
    AT_MOST: ClassVar[dict[str, int]] = {}

    def __post_init__(self) -> None:
        if self.spm and self.train_spm:
            raise ValueError("give either --spm or --train-spm, not both")
        by_flag = flat_settings(self)  # a nested settings value's fields by their flags' names too
        for name, least in self.AT_LEAST.items():
            value = by_flag.get(name)
            if value is not None and value < least:
                raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")
        for name, most in self.AT_MOST.items():
            value = by_flag.get(name)
            if value is not None and value > most:
                raise ValueError(f"--{name.replace('_', '-')} must be at most {most}, got {value}")


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


def stopped_line(command: str, step: int, total: int, out: Path) -> str:
    """What a run stopped before its last step says (Ctrl-C, SIGTERM, --stop-after): where it stands and
    the one command that continues it."""
    return (
        f"Stopped at step {step} of {total}; its checkpoint is in {out / 'checkpoints'}. Continue with the same "
        f"flags and --resume: python -m {command} ... --out {out} --resume"
    )
