"""Whether grouping windows into one backend call pays on this machine, measured at load.

On a GPU the overhead of a call is most of its cost and a batch of 8 costs little more than one window;
on a CPU running one thread a window is almost all arithmetic (the shipped model on a 2-core EPYC: two
windows of 192 tokens save 4% of their cost as one call, eight save at most 5%; at 48 tokens 14% and 25%).
There a batch mostly makes each window wait for the others: a request that arrives while 8 windows of
another tenant run waits for all 8. So the server times one window against a group of 2 and a group of
``size`` at a few lengths up to the model's longest, shortest first, once at load, and groups only windows
no longer than the longest length at which both groups saved at least ``MIN_SAVING`` of their cost (a
latency worth paying only for a real gain); longer ones run one per call (``--batching always`` groups
every window, as before; ``--max-batch-size 1`` none).

Measured, not extrapolated: the straight line through one length it drew before (an overhead per call plus
a cost per token, from one window against eight of the longest length) put its threshold anywhere from 1
to 43 tokens in three loads of the shipped model, where these measurements put it at 25 every time
(docs/bench/request-path-4/grouping-shipped-*.json).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

MIN_SAVING = 0.20  # grouping a window must save at least this fraction of its cost
REPEATS = 5
LENGTH_FRACTIONS = (8, 4, 2, 1)  # the lengths measured: the longest / 8, / 4, / 2 and itself
SMALLEST_GROUP = 2  # a group at light load, which saves the least
MIN_TOKENS = 4  # the shortest batch a backend is given (server.backends.base.dummy_batch pads to it)


@dataclass(frozen=True)
class BatchCurve:
    """One window and ``size`` windows of ``length`` tokens, timed (seconds, the fastest of a few calls:
    whatever else the machine did only ever adds to a call's time)."""

    length: int
    size: int
    one_s: float
    many_s: float

    @property
    def saving(self) -> float:
        """The fraction of their cost that running the ``size`` windows as one call saved."""
        return 1.0 - self.many_s / (self.size * self.one_s) if self.one_s > 0 else 0.0

    def describe(self) -> dict[str, float | int]:
        return {
            "length": self.length,
            "size": self.size,
            "one_window_ms": round(self.one_s * 1000, 3),
            "windows_ms": round(self.many_s * 1000, 3),
            "saving": round(self.saving, 3),
        }


@dataclass(frozen=True)
class Grouping:
    """What grouping saved at each measured length (shortest first), for a group of 2 and the largest;
    measuring stops at the first length where a group did not pay (nothing longer is grouped then)."""

    curves: tuple[BatchCurve, ...]

    def pays_at(self, length: int, min_saving: float = MIN_SAVING) -> bool:
        """Did every group measured at ``length`` save at least ``min_saving``?"""
        at = [c for c in self.curves if c.length == length]
        return bool(at) and all(c.saving >= min_saving for c in at)

    @property
    def lengths(self) -> list[int]:
        return sorted({c.length for c in self.curves})

    def solo_from(self, min_saving: float = MIN_SAVING) -> int | None:
        """Windows of at least this many tokens run one per call: those longer than the longest length
        up to which grouping paid at every measured length; 1 when it did not pay at the shortest, or
        nothing was measured (no window is grouped); None when it paid at every length (all are)."""
        if not self.curves:
            return 1
        paid = 0
        for length in self.lengths:
            if not self.pays_at(length, min_saving):
                return paid + 1
            paid = length
        return None

    def describe(self) -> dict[str, object]:
        return {"curves": [c.describe() for c in self.curves], "solo_from_tokens": self.solo_from()}


def measure(
    run: Callable[[Mapping[str, np.ndarray]], object],
    batch: Callable[[int, int], dict[str, np.ndarray]],
    length: int,
    size: int,
    repeats: int = REPEATS,
) -> BatchCurve:
    """Time ``run`` on ``batch(1, length)`` and ``batch(size, length)``, alternating, ``repeats`` times;
    the fastest of each."""
    one, many = batch(1, length), batch(size, length)
    times: dict[int, list[float]] = {1: [], size: []}
    for _ in range(repeats):
        for n, inputs in ((1, one), (size, many)):
            start = time.perf_counter()
            run(inputs)
            times[n].append(time.perf_counter() - start)
    return BatchCurve(length, size, min(times[1]), min(times[size]))


def measured_lengths(longest: int, shortest: int = 1, multiple_of: int | None = None) -> list[int]:
    """The lengths measured: ``longest`` / 8, / 4, / 2 and ``longest``, as the batcher pads them (up to
    ``multiple_of``, never past ``longest``), none below ``shortest`` (an engine's least length) or
    below the 4 tokens of the smallest batch a backend is given (``dummy_batch``)."""
    out = set()
    for k in LENGTH_FRACTIONS:
        n = max(shortest, MIN_TOKENS, longest // k)
        if multiple_of:
            n = min(longest, -(-n // multiple_of) * multiple_of)
        out.add(min(n, longest))
    return sorted(out)


def measure_grouping(
    run: Callable[[Mapping[str, np.ndarray]], object],
    batch: Callable[[int, int], dict[str, np.ndarray]],
    longest: int,
    size: int,
    shortest: int = 1,
    multiple_of: int | None = None,
    repeats: int = REPEATS,
    min_saving: float = MIN_SAVING,
) -> Grouping:
    """Groups of 2 and of ``size`` against one window at :func:`measured_lengths`, shortest first,
    stopping at the first length where a group saves less than ``min_saving`` (nothing longer would be
    grouped): on a CPU, where grouping hardly pays, a load measures a short length or two; only where
    it pays everywhere (a GPU) are all measured. Each group's size is measured only if the smaller one
    paid at that length."""
    sizes = sorted({min(SMALLEST_GROUP, size), size} - {1})
    curves: list[BatchCurve] = []
    for length in measured_lengths(longest, shortest, multiple_of):
        for n in sizes:
            curve = measure(run, batch, length, n, repeats)
            curves.append(curve)
            if curve.saving < min_saving:
                return Grouping(tuple(curves))
    return Grouping(tuple(curves))
