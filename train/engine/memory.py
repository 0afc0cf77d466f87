"""The bytes a training step holds, counted tensor by tensor, on real or fake tensors.

Activation memory (what bf16 autocast, activation checkpointing and frozen layers cut) is counted as
the storages that ops allocate and that are still alive, seen through a ``TorchDispatchMode``:

- autograd's saved-tensor hooks see only what is saved outside checkpointed regions: inside one,
  torch's checkpoint installs its own hooks (the innermost win), keeps the layer's inputs by
  reference and recomputes the layer in backward, so hooks would report a checkpointed model's
  activations as almost nothing and miss the recomputation that sets its peak;
- CUDA's allocator statistics need a GPU, and the profiler's memory events real allocations
  (xlnet-large at 4 x 384 tokens needs over 10 GiB of activations in fp32).

Every op's outputs pass through the mode, including those of backward, of checkpoint's
recomputation and of the optimizer, so the peak it records is the peak of live tensors (an
allocator adds its rounding and fragmentation on top). Under ``FakeTensorMode`` it counts a step of
any size without allocating it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind these tensors (tied or viewed tensors count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            st = t.untyped_storage()
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


def _storages(tree: Any) -> list[torch.UntypedStorage]:
    return [t.untyped_storage() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class LiveTensors(TorchDispatchMode):
    """While active, the bytes of the storages that ops allocate: ``current`` (alive now) and ``peak``.

    A storage counts once, from the op that allocates it until it is freed (a weak reference to it
    fires); outputs that share an input's storage (views, in-place ops) are not new memory, and
    storages that existed before (parameters, optimizer state, the batch) are not counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, weakref.ref] = {}

    def _freed(self, key: int, nbytes: int) -> None:
        self._live.pop(key, None)
        self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(st) for st in _storages((args, kwargs))}
        for st in _storages(out):
            key = id(st)
            if key in inputs or key in self._live:
                continue
            nbytes = st.nbytes()
            self._live[key] = weakref.ref(st, lambda _, key=key, nbytes=nbytes: self._freed(key, nbytes))
            self.current += nbytes
        self.peak = max(self.peak, self.current)
        return out


def gpu_peak_line(device: torch.device) -> str | None:
    """One line for the end of a run on a CUDA device: the allocator's peak, allocated and reserved,
    since that (not the model's size) says whether the run fits a smaller card. None off CUDA."""
    if device.type != "cuda":
        return None
    gib = 2**30
    allocated = torch.cuda.max_memory_allocated(device) / gib
    reserved = torch.cuda.max_memory_reserved(device) / gib
    line = f"Peak GPU memory on {device}: {allocated:.2f} GiB allocated, {reserved:.2f} GiB reserved"
    if reserved > 1.25 * allocated and "expandable_segments:True" not in os.environ.get(
        "PYTORCH_CUDA_ALLOC_CONF", ""
    ):
        line += " (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True keeps the reserve near the allocation)"
    return line
