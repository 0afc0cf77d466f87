"""The circuit breaker the per-key limits' store goes through (server/limits/breaker.py), on a fake clock:
closed until failures in a row, open for the cooldown (no call at all), one trial call then, closed by
its success, open again by its failure; a trial abandoned (its request cancelled) gives way to another,
and calls let in before the breaker opened never decide the trial."""

from __future__ import annotations

import pytest

from server.limits.breaker import Breaker, Call


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failures_in_a_row_open_it_and_one_trial_after_the_cooldown_closes_it() -> None:
    clock = Clock()
    b = Breaker(threshold=3, cooldown_s=2.0, clock=clock)
    call = b.allow()
    assert call is not None and not call.trial
    assert not b.failed(call) and not b.failed(call)
    b.succeeded(call)  # a success in between: the streak starts over
    assert not b.failed(call) and not b.failed(call) and b.failed(call)  # the third in a row opens it
    assert not b.closed and b.allow() is None
    clock.now = 1.9
    assert b.allow() is None
    clock.now = 2.0
    trial = b.allow()
    assert trial is not None and trial.trial and b.allow() is None  # one trial; the rest fall back
    assert b.succeeded(trial) and b.closed and b.allow() == Call()


def test_a_failed_trial_opens_it_again_and_an_abandoned_one_frees_the_trial() -> None:
    clock = Clock()
    b = Breaker(threshold=1, cooldown_s=2.0, clock=clock)
    early = b.allow()  # let in while closed, still running when the breaker opens
    assert early is not None and b.failed(Call())
    clock.now = 2.0
    trial = b.allow()
    assert trial is not None and trial.trial
    b.abandoned(early)  # not the trial: changes nothing
    assert b.allow() is None
    assert not b.failed(early) and b.allow() is None  # a late failure of an old call: the trial stands
    assert not b.failed(trial)  # the trial failed: open again, from now
    clock.now = 3.9
    assert b.allow() is None
    clock.now = 4.0
    again = b.allow()
    assert again is not None and again.trial
    b.abandoned(again)
    assert b.allow() is not None  # the trial's request left without a verdict: another call may try
    with pytest.raises(ValueError):
        Breaker(threshold=0)
