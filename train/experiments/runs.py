"""How the experiments set up the recipes' runs: configs built from code, resumed by the commands' rules."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from train.engine.session import RunConfig

C = TypeVar("C", bound=RunConfig)


def given(cls: type[C], **settings: Any) -> C:
    """``cls(**settings)`` with these settings counted as given, as a command counts the flags of its
    command line (``explicit_flags``): a ``resume`` checks exactly these against the run's record and
    restores the others from it, so an experiment's stage resumes by the same rules as the command."""
    return cls.of(**settings, explicit_flags=set(settings))


def short_pretraining(
    corpus: Sequence[str],
    spm: Path,
    preset: str,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float,
    max_gram: int,
) -> dict[str, Any]:
    """Pretraining settings of a CPU-sized run: memory and reuse of half a sequence, 5% warmup."""
    return {
        "corpus": list(corpus),
        "spm": str(spm),
        "config": preset,
        "steps": steps,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "lr": lr,
        "reuse_len": seq_len // 2,
        "mem_len": seq_len // 2,
        "warmup": max(1, steps // 20),
        "max_gram": max_gram,
    }
