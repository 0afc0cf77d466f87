"""A circuit breaker for a shared store the server can do without (the per-key limits' Redis).

Closed, every call goes to the store. After ``threshold`` failures in a row (an error, a timeout) it
opens: for ``cooldown_s`` no call goes there at all, so a store that is down, paused or read-only
costs each request nothing (the caller falls back at once) instead of a timeout each. Then one trial
call is let through (half-open) while every other call still falls back; its success closes the
breaker, its failure opens it for another ``cooldown_s``. Envoy's outlier detection and Kong's
``fault_tolerant`` rate limiting degrade the same way: a sick dependency is skipped, not waited on.

Plain bookkeeping on one event loop (no lock, no I/O); the caller times its calls and reports them.
"""

from __future__ import annotations

import time
from collections.abc import Callable


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

    def allow(self) -> bool:
        """Call the store now? Closed: yes. Open: no, except one trial call once ``cooldown_s`` passed."""
        if self.opened_at is None:
            return True
        if self._trial or self._clock() - self.opened_at < self.cooldown_s:
            return False
        self._trial = True
        return True

    def succeeded(self) -> bool:
        """A call succeeded; returns True when this closed an open breaker (the store is back)."""
        reopened = self.opened_at is not None
        self.failures, self.opened_at, self._trial = 0, None, False
        return reopened

    def abandoned(self) -> None:
        """A call ended with no verdict on the store (its request was cancelled): a trial may be made again."""
        self._trial = False

    def failed(self) -> bool:
        """A call failed; returns True when this opened a closed breaker (the store went away)."""
        self.failures += 1
        was_closed = self.opened_at is None
        if not was_closed or self.failures >= self.threshold:
            self.opened_at, self._trial = self._clock(), False
        return was_closed and self.opened_at is not None
