"""Whether grouping windows into one backend call pays on this machine, measured at load.

On a GPU the overhead of a call is most of its cost and a batch of 8 costs little more than one window;
on a CPU running one thread a window is almost all arithmetic, and 8 of them cost nearly 8 times one
(the shipped model on a 2-core EPYC: 5.1 ms for one window of 192 tokens, 35.5 ms for eight, a 9% saving;
two windows of 64 tokens save 17%). There a batch mostly makes each window wait for the others: a request
that arrives while 8 windows of another tenant run waits for all 8. So the server times one window
against a group of 2 and a group of ``size`` at a few lengths up to the model's longest, once at load,
and groups only windows no longer than the longest length at which both groups saved at least
``MIN_SAVING`` of their cost (a latency worth paying only for a real gain); longer ones run one per call
(``--batching always`` groups every window, as before; ``--max-batch-size 1`` none).

Measured, not extrapolated: a straight line through one length (an overhead per call plus a cost per
token) promised 32% at 64 tokens where two windows saved 17%, and the windows it grouped cost the shipped
model 2% of its throughput at 16 clients (BENCHMARKS.md, machine V).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MIN_SAVING = 0.20  # grouping a window must save at least this fraction of its cost
REPEATS = 5
LENGTH_FRACTIONS = (8, 4, 2, 1)  # the lengths measured: the longest / 8, / 4, / 2 and itself
SMALLEST_GROUP = 2  # a group at light load, which saves the least


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
    """What grouping saved at each measured length (shortest first), for a group of 2 and the largest."""

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
        up to which grouping paid at every measured length; 1 when it did not pay at the shortest (no
        window is grouped), None when it paid at every length (all are)."""
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


def measure_grouping(
    run: Callable[[Mapping[str, np.ndarray]], object],
    batch: Callable[[int, int], dict[str, np.ndarray]],
    longest: int,
    size: int,
    shortest: int = 1,
    repeats: int = REPEATS,
) -> Grouping:
    """Groups of 2 and of ``size`` against one window at ``longest`` / 8, / 4, / 2 and ``longest`` tokens
    (none below ``shortest``, e.g. a TensorRT profile's least length)."""
    lengths = sorted({max(shortest, longest // k, 1) for k in LENGTH_FRACTIONS})
    sizes: Sequence[int] = sorted({min(SMALLEST_GROUP, size), size})
    curves = [measure(run, batch, n, s, repeats) for n in lengths for s in sizes if s > 1]
    return Grouping(tuple(curves))
