"""Flags both training commands take, declared once: what each one parses to (its type, choices,
action) here, beside the config fields of :class:`train.engine.session.TrainingConfig`. Each command
still chooses its defaults (its config's) and its help text, since pretraining and fine-tuning may differ,
and where each flag appears in its --help."""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

from train.engine.optim import DECAYS, OPTIMIZERS
from train.engine.step import PRECISIONS
from train.model import ACTIVATIONS, PRESETS

# The flags of the fields of RunConfig and TrainingConfig, by destination (``--batch-size`` is
# ``batch_size``): how argparse reads each one; the default and help come from the command.
SHARED_FLAGS: dict[str, dict[str, Any]] = {
    # where the model and its tokenizer come from
    "init": {},
    "config": {"choices": sorted(PRESETS)},
    "spm": {},
    "train_spm": {"type": int, "metavar": "VOCAB_SIZE"},
    "dropout": {"type": float},
    "activation": {"choices": ACTIVATIONS},
    "aoa": {"action": "store_true"},
    # optimisation
    "steps": {"type": int},
    "batch_size": {"type": int},
    "grad_accum": {"type": int},
    "lr": {"type": float},
    "warmup": {"type": int},
    "decay": {"choices": DECAYS},
    "min_lr_ratio": {"type": float},
    "optimizer": {"choices": OPTIMIZERS},
    "weight_decay": {"type": float},
    "adam_eps": {"type": float},
    "clip": {"type": float},
    "device": {},
    "seed": {"type": int},
    "threads": {"type": int},
    # run
    "out": {"required": True},
    "log_every": {"type": int},
    "save_every": {"type": int},
    "keep_last": {"type": int},
    "stop_after": {"type": int},
    "no_progress": {"action": "store_true"},
}


def add_shared_flags(group: argparse._ArgumentGroup, defaults: SimpleNamespace, **helps: str | None) -> None:
    """Add the named flags of :data:`SHARED_FLAGS` in the order given, each with the command's help
    (None: none) and its config's default (``defaults``, from ``Config.defaults()``; a required flag
    has none)."""
    for dest, text in helps.items():
        spec = dict(SHARED_FLAGS[dest])
        if hasattr(defaults, dest):
            spec["default"] = getattr(defaults, dest)
        if text is not None:
            spec["help"] = text
        group.add_argument("--" + dest.replace("_", "-"), **spec)


def add_step_compute_flags(group: argparse._ArgumentGroup, precision_default: str) -> None:
    """``--precision`` and ``--activation-checkpointing``: memory and speed, never the result's meaning."""
    group.add_argument("--precision", choices=PRECISIONS, default=precision_default)
    group.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="keep each layer's inputs only and recompute the layer in backward: far less activation "
        "memory for one more forward pass per step, same gradients",
    )
