"""Features -> arrays a model takes: which training windows to keep, and right-padding a micro-batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qa_core.contract import PAD_ID, SEG_ID_PAD

from .data import SquadExample
from .features import Feature


def subsample_out_of_window(
    features: Sequence[Feature], examples: Sequence[SquadExample], keep: float, seed: int = 0
) -> list[Feature]:
    """Training windows with `keep` (0..1) of the out-of-window ones: windows of an answerable question
    that do not hold its answer (labelled `<cls>`, like an unanswerable question). Windows holding
    the answer and every window of an unanswerable question stay. Long contexts with short windows
    make most training windows out-of-window; the original keeps them all (keep=1).
    """
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must be in [0, 1], got {keep}")
    if keep == 1.0:
        return list(features)
    rng = np.random.default_rng(seed)
    draws = rng.random(len(features))
    return [
        f
        for f, u in zip(features, draws, strict=True)
        if not f.is_impossible or not examples[f.example_index].answers or u < keep
    ]


def pad_batch(
    features: Sequence[Feature],
    pad_to: int | None = None,
    multiple_of: int | None = None,
    include_labels: bool = False,
    max_length: int | None = None,
) -> dict[str, np.ndarray]:
    """Right-pad features into int64 arrays ``[B, T]``: input_ids, attention_mask, token_type_ids, p_mask.

    T is the longest feature, or ``pad_to`` (which must fit them all), rounded up to a multiple of
    ``multiple_of`` (e.g. 8 for tensor cores, or to limit the number of distinct shapes an engine
    sees) but never past ``max_length`` (the longest input the model or engine takes). Padding is PAD_ID / 0 / SEG_ID_PAD / 1. ``include_labels`` adds ``[B]`` arrays cls_index,
    start_positions, end_positions and is_impossible for training (labelled features only).
    """
    if not features:
        raise ValueError("pad_batch: no features")
    longest = max(len(f.input_ids) for f in features)
    length = longest if pad_to is None else pad_to
    if length < longest:
        raise ValueError(f"pad_batch: pad_to={pad_to} is shorter than the longest feature ({longest})")
    if multiple_of:
        rounded = -(-length // multiple_of) * multiple_of
        length = rounded if max_length is None else max(length, min(rounded, max_length))
    n = len(features)
    batch = {
        "input_ids": np.full((n, length), PAD_ID, dtype=np.int64),
        "attention_mask": np.zeros((n, length), dtype=np.int64),
        "token_type_ids": np.full((n, length), SEG_ID_PAD, dtype=np.int64),
        "p_mask": np.ones((n, length), dtype=np.int64),
    }
    for i, f in enumerate(features):
        k = len(f.input_ids)
        batch["input_ids"][i, :k] = f.input_ids
        batch["attention_mask"][i, :k] = f.attention_mask
        batch["token_type_ids"][i, :k] = f.token_type_ids
        batch["p_mask"][i, :k] = f.p_mask
    if include_labels:
        if any(f.start_position is None or f.end_position is None for f in features):
            raise ValueError("pad_batch: include_labels needs features made with is_training=True")
        batch["cls_index"] = np.array([f.cls_index for f in features], dtype=np.int64)
        batch["start_positions"] = np.array([f.start_position for f in features], dtype=np.int64)
        batch["end_positions"] = np.array([f.end_position for f in features], dtype=np.int64)
        batch["is_impossible"] = np.array([f.is_impossible for f in features], dtype=np.int64)
    return batch
