"""Whether grouping windows into one backend call pays on this machine, measured at load.

A call costs about ``overhead + per_token x tokens`` per window: grouping ``n`` windows saves the
overhead of ``n - 1`` calls and nothing else. On a GPU the overhead is most of a call and a batch of 8
costs little more than one window; on a CPU running one thread a window of 192 tokens is almost all
arithmetic, and 8 of them cost 8 times one (the shipped model on a 2-core EPYC, three loads: 8.9-10.9 ms
for one, 67-86 ms for eight, a 6% saving at best: docs/bench/door-round-three/batch-curve-shipped.json). There a batch only makes each window wait for the others: a request
that arrives while 8 windows of another tenant run waits for all 8. So the server times one window
and ``size`` windows of the model's longest length once, at load, and groups only windows short enough
for grouping to save at least ``MIN_SAVING`` of their cost (a latency worth paying only for a real
gain); longer ones run one per call (``--batching always`` groups every window, as before;
``--max-batch-size 1`` none).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

MIN_SAVING = 0.20  # grouping a window must save at least this fraction of its cost
REPEATS = 5


@dataclass(frozen=True)
class BatchCurve:
    """One window and ``size`` windows of ``length`` tokens, timed (seconds, the fastest of a few calls:
    whatever else the machine did only ever adds to a call's time)."""

    length: int
    size: int
    one_s: float
    many_s: float

    @property
    def overhead_s(self) -> float:
        """What a call costs beyond its windows' tokens: what grouping saves per window."""
        return max(0.0, (self.size * self.one_s - self.many_s) / (self.size - 1))

    @property
    def per_token_s(self) -> float:
        return max(1e-12, (self.one_s - self.overhead_s) / self.length)

    def saving(self, length: int) -> float:
        """The fraction of a window's cost that grouping it saves, at ``length`` tokens."""
        return self.overhead_s / (self.overhead_s + self.per_token_s * length)

    def solo_from(self, min_saving: float = MIN_SAVING) -> int | None:
        """Windows of at least this many tokens run one per call (grouping them saves less than
        ``min_saving``); None when grouping pays at every length up to the one measured."""
        longest = self.overhead_s * (1 - min_saving) / (min_saving * self.per_token_s)
        if longest >= self.length:
            return None
        return max(1, math.floor(longest) + 1)

    def describe(self) -> dict[str, float | int | None]:
        return {
            "measured_length": self.length,
            "measured_size": self.size,
            "one_window_ms": round(self.one_s * 1000, 3),
            "windows_ms": round(self.many_s * 1000, 3),
            "solo_from_tokens": self.solo_from(),
        }


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
