"""The one interface every inference backend implements (onnxruntime, TensorRT, torch eager).

The server only ever calls :meth:`Backend.run` on a padded int64 batch and reads outputs by name, so
the batcher, the decoder and the HTTP layer are identical whatever runs the model.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from qa_core.contract import CLS_ID, PAD_ID, SEG_ID_CLS, SEG_ID_PAD, SEG_ID_QUESTION, SEP_ID, TOKEN_OUTPUTS
from server.answering.model_spec import ModelSpec

if TYPE_CHECKING:
    from server.settings import ServerSettings


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (package or GPU missing); the server exits 2 with this one line."""


class Backend(abc.ABC):
    """Runs the QA model: ``run({input_ids, attention_mask, token_type_ids} [B, T]) -> {output: [B, ...]}``."""

    name: str = "base"

    @classmethod
    def preflight(cls, settings: ServerSettings) -> None:
        """Checks before the server listens, fast (no model loaded): raise :class:`BackendUnavailable`
        with one line saying what to do when this backend cannot run here with these settings."""
        return None  # nothing to check unless a backend says otherwise

    @classmethod
    def check_spec(cls, spec: ModelSpec, settings: ServerSettings) -> None:
        """What the model itself rules out on this backend before listening (raise
        :class:`BackendUnavailable`)."""
        return None  # nothing is ruled out unless a backend says otherwise

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, spec: ModelSpec, settings: ServerSettings) -> Backend:
        """The backend for ``spec`` as the server's settings ask (slow: loads the model)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.head = spec.head
        self.output_names: tuple[str, ...] = spec.output_names
        self.input_names: tuple[str, ...] = spec.input_names

    @abc.abstractmethod
    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs for one padded batch, keyed by output name; row i belongs to batch row i.

        Called from a worker thread, never from the event loop; must be safe to call from several
        threads when ``inference_workers > 1``.
        """

    def describe(self) -> dict[str, Any]:
        """What the backend runs on, for ``/v1/model`` and the startup log (providers, device, threads)."""
        return {"backend": self.name}

    def warmup(self, lengths: tuple[int, ...] = (16,), batch_sizes: tuple[int, ...] = (1,)) -> None:
        """Run dummy batches of each shape, so the first real request does not pay for allocation
        and kernel selection (onnxruntime arenas, TensorRT contexts, torch's first-call overheads)."""
        for b in batch_sizes:
            for t in lengths:
                self.run(dummy_batch(b, t))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release sessions/engines (called once at shutdown)."""


def batch_limit(spec: ModelSpec, settings: ServerSettings) -> int:
    """The most windows in one backend call: the setting, within what the model (an engine) accepts."""
    return min(settings.max_batch_size, spec.max_batch_size or settings.max_batch_size)


def dummy_batch(batch_size: int, length: int) -> dict[str, np.ndarray]:
    """A batch with the XLNet layout ``P <sep> Q <sep> <cls>`` (ids from the special range, valid in every vocab)."""
    length = max(length, 4)
    ids = np.full((batch_size, length), 9, dtype=np.int64)
    types = np.zeros((batch_size, length), dtype=np.int64)
    half = length // 2
    ids[:, half - 1] = SEP_ID
    types[:, half:] = SEG_ID_QUESTION
    ids[:, -2] = SEP_ID
    ids[:, -1] = CLS_ID
    types[:, -1] = SEG_ID_CLS
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types}


# What pad_batch writes past a window's tokens, per input.
PAD_VALUES = {"input_ids": PAD_ID, "attention_mask": 0, "token_type_ids": SEG_ID_PAD}


def padded_to(batch: Mapping[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """``batch`` with every window padded on the right to ``length`` tokens as ``pad_batch`` pads (the
    padding is masked, so the real tokens' outputs do not change): how a backend runs a window shorter
    than its graph's least length (``ModelSpec.min_engine_seq_len``)."""
    rows, short = batch["input_ids"].shape
    out = {}
    for name, fill in PAD_VALUES.items():
        wide = np.full((rows, length), fill, dtype=np.asarray(batch[name]).dtype)
        wide[:, :short] = batch[name]
        out[name] = wide
    return out


def cut_tokens(outputs: Mapping[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """Per-token outputs cut back to ``length`` tokens (the others as they are)."""
    return {n: v[:, :length] if n in TOKEN_OUTPUTS else v for n, v in outputs.items()}


def run_at_least(
    spec: ModelSpec,
    batch: Mapping[str, np.ndarray],
    run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """``run(batch)``, a batch shorter than the graph's least length (``spec.min_engine_seq_len``) padded
    up to it and its outputs cut back: what an engine backend's ``run`` is, for any caller."""
    length = batch["input_ids"].shape[1]
    least = spec.min_engine_seq_len or 1
    return cut_tokens(run(padded_to(batch, least)), length) if length < least else run(batch)


def check_outputs(outputs: Mapping[str, np.ndarray], names: tuple[str, ...], batch_size: int) -> None:
    """Fail loudly (and only this batch) when a backend returns something the decoder cannot read."""
    for name in names:
        if name not in outputs:
            raise RuntimeError(f"backend returned no {name!r} (got {sorted(outputs)})")
        if outputs[name].shape[0] != batch_size:
            raise RuntimeError(
                f"backend output {name!r} has batch {outputs[name].shape[0]}, expected {batch_size}"
            )
