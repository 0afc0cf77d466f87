"""Segments A and B of one example, cut at sentence boundaries (`_split_a_and_b` of the original).

B is the true continuation of A with probability 0.5, otherwise a random run of whole sentences drawn
from the same stream (as in the original). Either way the stream itself only advances by `reuse_len`
per example (the original ignores the `new_begin` it computes), see `train.data.pretrain_batches`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qa_core.contract import CLS_ID, SEP_ID
from train.data.config import NUM_FUNCTIONAL
from train.data.rows import ArrayBoundaries, Boundaries, Row


@dataclass(frozen=True)
class SegmentPair:
    """Half-open ranges `[a_begin, a_end)` and `[b_begin, b_end)` of a stream row."""

    a_begin: int
    a_end: int
    b_begin: int
    b_end: int
    is_next: bool

    @property
    def a_len(self) -> int:
        return self.a_end - self.a_begin

    @property
    def b_len(self) -> int:
        return self.b_end - self.b_begin


def split_a_and_b(
    data_len: int,
    boundaries: Boundaries | np.ndarray,
    begin: int,
    tot_len: int,
    rng: np.random.Generator,
) -> SegmentPair | None:
    """Choose A (starting at `begin`) and B with `a_len + b_len == tot_len`, or `None` past the end.

    `boundaries` are the sorted positions where a new sentence starts in the row (looked up lazily,
    `train.data.rows`, or an array). Cut points are the boundaries strictly inside
    `(begin, begin + tot_len)`; A always ends on one of them when one exists.
    - continuation (p = 0.5, needs a cut point): B runs from A's end to the first boundary at or
      after `begin + tot_len` (or the end of the row);
    - random (otherwise, and always without a cut point): B starts at a uniform position in the row,
      widened to whole sentences.
    Then the longer segment is trimmed from its right end until both fit in `tot_len`.
    """
    if begin + tot_len >= data_len:
        return None
    bounds = ArrayBoundaries(boundaries) if isinstance(boundaries, np.ndarray) else boundaries
    lo = bounds.search(begin, "right")
    hi = bounds.search(begin + tot_len, "left")
    n_cut = hi - lo
    end_idx = bounds.at(hi) if hi < len(bounds) else data_len

    a_begin = begin
    if n_cut == 0 or rng.random() < 0.5:
        is_next = False
        a_end = end_idx if n_cut == 0 else bounds.at(lo + int(rng.integers(n_cut)))
        b_len = max(1, tot_len - (a_end - a_begin))
        # `data_len - 1`: the original keeps one token after B for its LM target.
        b_begin = int(rng.integers(0, data_len - 1 - b_len + 1))
        b_end = b_begin + b_len
        # Widen B to whole sentences: back to its sentence start, forward to the next boundary.
        k = bounds.search(b_begin, "right")
        b_begin = bounds.at(k - 1) if k > 0 else 0
        k = bounds.search(b_end, "left")
        b_end = min(bounds.at(k) if k < len(bounds) else data_len, data_len - 1)
    else:
        is_next = True
        a_end = bounds.at(lo + int(rng.integers(n_cut)))
        b_begin = a_end
        b_end = end_idx

    while (a_end - a_begin) + (b_end - b_begin) > tot_len:
        if a_end - a_begin > b_end - b_begin:
            a_end -= 1  # delete the right side only
        else:
            b_end -= 1
    return SegmentPair(a_begin, a_end, b_begin, b_end, is_next)


def assemble_example(
    row: Row | np.ndarray, start: int, reuse_len: int, pair: SegmentPair
) -> tuple[np.ndarray, np.ndarray]:
    """Lay out `reuse + A + <sep> + B + <sep> + <cls>`; returns (input ids int64, segment ids int64).

    Segment ids: reuse part + A + first `<sep>` = 0, B + second `<sep>` = 1, `<cls>` = 2.
    """
    reuse = row[start : start + reuse_len]
    ids = np.concatenate(
        [
            reuse,
            row[pair.a_begin : pair.a_end],
            [SEP_ID],
            row[pair.b_begin : pair.b_end],
            [SEP_ID, CLS_ID],
        ]
    ).astype(np.int64)
    seg = np.concatenate(
        [
            np.zeros(reuse_len + pair.a_len + 1, dtype=np.int64),
            np.ones(pair.b_len + 1, dtype=np.int64),
            np.full(1, 2, dtype=np.int64),
        ]
    )
    assert ids.shape[0] == reuse_len + pair.a_len + pair.b_len + NUM_FUNCTIONAL
    return ids, seg
