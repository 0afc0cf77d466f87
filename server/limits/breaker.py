"""A circuit breaker for a shared store the server can do without (the per-key limits' Redis).

Closed, every call goes to the store. After ``threshold`` failures in a row (an error, a timeout) it
opens: for ``cooldown_s`` no call goes there at all, so a store that is down, paused or read-only
costs each request nothing (the caller falls back at once) instead of a timeout each. Then one trial
call is let through (half-open) while every other call still falls back; its success closes the
breaker, its failure opens it for another ``cooldown_s``. Envoy's outlier detection and Kong's
``fault_tolerant`` rate limiting degrade the same way: a sick dependency is skipped, not waited on.

Plain bookkeeping on one event loop (no lock, no I/O); the caller times its calls and reports how
each ended, with the :class:`Call` :meth:`Breaker.allow` gave it (so that only the trial's end decides
the trial, whatever calls let in before the breaker opened do meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    """One call let through: ``trial`` when it is the half-open breaker's one try."""

    trial: bool = False


class Breaker:
    """Whether to call the store now (:meth:`allow`), told how each call ended (see the module doc)."""

    def __init__(
        self, threshold: int = 3, cooldown_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if threshold < 1 or cooldown_s <= 0:
            raise ValueError("a breaker needs threshold >= 1 and cooldown_s > 0")
        self.threshold, self.cooldown_s, self._clock = threshold, cooldown_s, clock
        self.failures = 0  # in a row
        self.opened_at: float | None = None
        self._trial = False  # the half-open trial call is in flight

    @property
    def closed(self) -> bool:
        """The store is in use (no failure streak has opened the breaker)."""
        return self.opened_at is None

    def allow(self) -> Call | None:
        """A call to make now, or None (fall back). Closed: always. Open: only one trial call, once
        ``cooldown_s`` has passed since it opened (or since the last trial failed)."""
        if self.opened_at is None:
            return Call()
        if self._trial or self._clock() - self.opened_at < self.cooldown_s:
            return None
        self._trial = True
        return Call(trial=True)

    def succeeded(self, call: Call) -> bool:
        """``call`` succeeded: the store answers, the breaker closes. True when that closed an open one."""
        reopened = self.opened_at is not None
        self.failures, self.opened_at, self._trial = 0, None, False
        return reopened

    def failed(self, call: Call) -> bool:
        """``call`` failed; True when this opened a closed breaker (the store went away). A failed trial
        opens it for another cooldown; a call let in before it opened only counts."""
        self.failures += 1
        if self.opened_at is None:
            if self.failures >= self.threshold:
                self.opened_at = self._clock()
                return True
            return False
        if call.trial:
            self.opened_at, self._trial = self._clock(), False
        return False

    def abandoned(self, call: Call) -> None:
        """``call`` ended with no verdict on the store (its request was cancelled): if it was the trial,
        another call may try."""
        if call.trial:
            self._trial = False
