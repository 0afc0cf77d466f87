"""Resumable training state: model + optimizer + scheduler + RNG + data position, written atomically.

Layout of a run directory:
    OUT/checkpoints/step-0000100/  one directory per save: a model checkpoint (train.model.checkpoint.load
                                   reads it) + `trainer.pt` (optimizer/scheduler/torch RNG, tensors
                                   only, read with weights_only=True) + `trainer.json` (step, python
                                   and numpy RNG, data-stream position)
    OUT/checkpoints/latest         text file naming the newest complete step directory
A save writes a temporary directory and renames it, then rewrites `latest` with os.replace, so a kill
at any moment leaves either the previous or the new checkpoint, never a half-written one. No pickle
of arbitrary objects is ever read back.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from train.common.atomic_dir import atomic_write_text
from train.model import checkpoint


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (its temporary files are gone; `latest` is unchanged)."""


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return cast(torch.nn.Module, model.module) if hasattr(model, "module") else model


def to_jsonable(obj: Any) -> Any:
    """numpy arrays/scalars and tuples -> tagged JSON values that `from_jsonable` restores exactly."""
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [to_jsonable(x) for x in obj]}
    if isinstance(obj, list):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def from_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        if "__tuple__" in obj:
            return tuple(from_jsonable(x) for x in obj["__tuple__"])
        return {k: from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_jsonable(x) for x in obj]
    return obj


def save_training_state(
    out_dir: Path,
    step: int,
    model,
    optimizer,
    scheduler,
    *,
    tokenizer=None,
    data_state: Any = None,
    extra: dict | None = None,
    metadata: dict | None = None,
    keep_last: int = 3,
    extra_tensors: dict | None = None,
) -> Path:
    ckpt_root = Path(out_dir) / "checkpoints"
    target = ckpt_root / f"step-{step:07d}"
    tensors = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "torch_rng": torch.get_rng_state(),
        **(extra_tensors or {}),
    }
    buf = io.BytesIO()
    torch.save(tensors, buf)
    plain = {
        "step": step,
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "data": data_state,
        "extra": extra or {},
    }
    files = {"trainer.pt": buf.getvalue(), "trainer.json": json.dumps(to_jsonable(plain)).encode()}
    try:
        checkpoint.save(
            unwrap(model), target, tokenizer=tokenizer, metadata=metadata or {}, extra_files=files
        )
    except OSError as exc:  # disk full, file-size limit, read-only: say so, and that nothing was lost
        previous = latest_checkpoint(out_dir)
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointWriteError(f"could not write checkpoint {target}: {exc}; {kept}") from exc
    atomic_write_text(ckpt_root / "latest", target.name)
    steps = sorted(p for p in ckpt_root.glob("step-*") if p.is_dir() and p != target)
    for old in steps[: max(0, len(steps) - (keep_last - 1))] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)  # never the checkpoint `latest` now names
    return target


def latest_checkpoint(out_dir: Path) -> Path | None:
    ckpt_root = Path(out_dir) / "checkpoints"
    pointer = ckpt_root / "latest"
    if pointer.exists():
        candidate = ckpt_root / pointer.read_text().strip()
        if (candidate / "trainer.json").exists():
            return candidate
    steps = sorted(p for p in ckpt_root.glob("step-*") if (p / "trainer.json").exists())
    return steps[-1] if steps else None


def load_training_state(path: Path, model, optimizer, scheduler) -> dict:
    """Restore weights, optimizer, scheduler and every RNG; return {step, data, extra}."""
    path = Path(path)
    loaded = checkpoint.load(path)
    unwrap(model).load_state_dict(loaded.model.state_dict())
    tensors = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
    try:
        optimizer.load_state_dict(tensors["optimizer"])
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(
            f"{path}: its optimizer state does not fit this run's optimizer ({exc}); it was written with other "
            f"settings or by an older version: start a new run, or start from its weights with --init {path}"
        ) from None
    if scheduler is not None and tensors.get("scheduler") is not None:
        scheduler.load_state_dict(tensors["scheduler"])
    torch.set_rng_state(tensors["torch_rng"])
    plain = from_jsonable(json.loads((path / "trainer.json").read_text()))
    py_state = plain["python_rng"]
    random.setstate((py_state[0], tuple(py_state[1]), py_state[2]))
    np.random.set_state(plain["numpy_rng"])
    return {"step": plain["step"], "data": plain["data"], "extra": plain["extra"]}
