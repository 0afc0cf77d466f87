"""The circuit breaker the per-key limits' store goes through (server/breaker.py), on a fake clock:
closed until failures in a row, open for the cooldown (no call at all), one trial call then, closed by
its success, open again by its failure; a trial abandoned (its request cancelled) gives way to another."""

from __future__ import annotations

import pytest

from server.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failures_in_a_row_open_it_and_one_trial_after_the_cooldown_closes_it() -> None:
    clock = Clock()
    b = Breaker(threshold=3, cooldown_s=2.0, clock=clock)
    assert b.allow() and not b.failed() and not b.failed()
    b.succeeded()  # a success in between: the streak starts over
    assert not b.failed() and not b.failed() and b.failed()  # the third in a row opens it
    assert not b.closed and not b.allow()
    clock.now = 1.9
    assert not b.allow()
    clock.now = 2.0
    assert b.allow() and not b.allow()  # one trial, every other call falls back meanwhile
    assert b.succeeded() and b.closed and b.allow()


def test_a_failed_trial_opens_it_for_another_cooldown_and_an_abandoned_one_frees_the_trial() -> None:
    clock = Clock()
    b = Breaker(threshold=1, cooldown_s=2.0, clock=clock)
    assert b.failed()
    clock.now = 2.0
    assert b.allow()
    assert not b.failed()  # still open (it was not closed), from now
    clock.now = 3.9
    assert not b.allow()
    clock.now = 4.0
    assert b.allow()
    b.abandoned()
    assert b.allow()  # the trial's request left without a verdict: another call may try
    with pytest.raises(ValueError):
        Breaker(threshold=0)
