"""Where the job runs: seeds, torchrun/DDP, devices, mixed precision, Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import random
import signal
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_name: str = "auto") -> Dist:
    """Under torchrun (WORLD_SIZE set) start a process group: nccl on CUDA, gloo on CPU."""
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(device_name if device_name == "cpu" else f"cuda:{local}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=rank, world_size=world, local_rank=local, device=device)


def to_tensors(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch of numpy arrays on the job's device."""
    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}


def all_reduce_mean(value: float, d: Dist) -> float:
    if not d.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=d.device)  # NCCL reduces device tensors only
    dist.all_reduce(t)
    return (t / d.world_size).item()


def agree_any(flag: bool, d: Dist) -> bool:
    """True on every rank if it is true on any (a SIGTERM reaches one rank; all must stop at the same
    step, or the next collective would pair different calls and hang)."""
    if not d.enabled:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def autocast(precision: str, device: torch.device):
    """bf16/fp16 autocast where the device supports it; fp32 is a no-op context."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if device.type == "cpu" and dtype == torch.float16:
        raise ValueError("--precision fp16 needs a CUDA device; use bf16 or fp32 on CPU")
    return torch.autocast(device_type=device.type, dtype=dtype)


class StopFlag:
    """First Ctrl-C (SIGINT) or SIGTERM asks the loop to checkpoint and exit; a second one kills."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nStop requested: saving a checkpoint, then exiting (press Ctrl-C again to abort).", flush=True
        )

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
