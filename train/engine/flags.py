"""Flags both training commands take, declared once: how a step computes (precision, activation
checkpointing). Each command passes its own default, since pretraining and fine-tuning may differ."""

from __future__ import annotations

import argparse

from train.engine.step import PRECISIONS


def add_step_compute_flags(group: argparse._ArgumentGroup, precision_default: str) -> None:
    """``--precision`` and ``--activation-checkpointing``: memory and speed, never the result's meaning."""
    group.add_argument("--precision", choices=PRECISIONS, default=precision_default)
    group.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="keep each layer's inputs only and recompute the layer in backward: far less activation "
        "memory for one more forward pass per step, same gradients",
    )
