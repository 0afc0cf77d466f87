"""The micro-batcher's scheduling policy on its own: plain synchronous calls with a fake clock (every
``now`` is a number chosen by the test), stand-in questions whose windows are only lengths.

Admission and the queue bound, round-robin fairness, aging, the padding cap, lookahead, the wait for a
full batch, dropping dead questions, and the deadlines of large requests (urgency, refusal at admission,
giving up on work that can no longer make it), down to a simulated saturated server."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest

from server.answering.scheduling import URGENCY_MARGIN, QueueFull, Request, Scheduler


@dataclass(eq=False)
class Q:
    """A stand-in question: windows of the given lengths."""

    name: str
    lengths: list[int]
    dead: bool = False
    undispatched: int = 0
    request: Request | None = None

    @property
    def features(self) -> list[range]:
        return [range(n) for n in self.lengths]


def submit(
    policy: Scheduler, now: float, *questions: Q, deadline: float | None = None, caller: str = ""
) -> Request:
    """One request of ``caller`` holding ``questions`` (all of their windows), admitted at ``now``."""
    request: Request = Request(deque(), now, deadline, caller=caller)
    for q in questions:
        q.undispatched, q.request = len(q.lengths), request
        request.windows.extend((q, i) for i in range(len(q.lengths)))
    policy.admit(request, now)
    return request


def names(windows: list) -> list[str]:
    return [f"{q.name}{i}" for q, i in windows]


def batch(policy: Scheduler, now: float) -> list[str]:
    chosen = policy.next_batch(now)
    assert chosen.unreachable == []
    return names(chosen.windows)


# ---- admission -------------------------------------------------------------------------------------


def test_the_queue_is_bounded_in_windows_and_refuses_without_queueing() -> None:
    policy = Scheduler(max_batch_size=4, max_queue=5)
    submit(policy, 0.0, Q("a", [10, 10, 10]))
    policy.check_queue(2)  # exactly at the bound
    with pytest.raises(QueueFull, match=r"3 windows are waiting and this request has 3 \(limit 5\)"):
        policy.check_queue(3)
    assert policy.waiting == 3 and len(policy.ring) == 1


# ---- fairness ------------------------------------------------------------------------------------------


def test_small_requests_are_served_round_robin_beside_a_huge_one() -> None:
    policy = Scheduler(max_batch_size=4, aging_s=0.0)
    submit(policy, 0.0, Q("H", [10] * 10))
    for name in "abc":
        submit(policy, 0.0, Q(name, [10]))
    assert policy.waiting == 13 and policy.full
    assert batch(policy, 0.0) == ["H0", "a0", "b0", "c0"]  # one window per request per round
    assert batch(policy, 0.0) == ["H1", "H2", "H3", "H4"]  # only the huge one is left
    assert policy.waiting == 5
    late = Q("d", [10])
    submit(policy, 0.1, late)
    assert batch(policy, 0.1) == ["H5", "d0", "H6", "H7"]  # a newcomer gets a slot in the next batch


def test_callers_take_turns_however_many_requests_each_has_queued() -> None:
    """One key's sixteen requests of many windows, another key's one question: the second key's window
    leads the next batch (a caller with nothing waiting comes in first), and the two keys alternate while
    both wait (not 16 to 1)."""
    policy = Scheduler(max_batch_size=4, aging_s=0.0)
    for k in range(16):
        submit(policy, 0.0, Q(f"x{k}-", [10] * 40), caller="flood")
    submit(policy, 0.0, Q("y", [10, 10]), caller="tenant")
    assert batch(policy, 0.0) == ["y0", "x0-0", "y1", "x1-0"]
    flood_only = batch(policy, 0.0)  # the tenant is done: the rest is the flood's
    assert flood_only == ["x2-0", "x3-0", "x4-0", "x5-0"]
    submit(policy, 0.0, Q("z", [10]), caller="tenant")
    assert batch(policy, 0.0)[:2] == ["z0", "x6-0"]


def test_a_caller_coming_back_at_once_waits_for_the_others_and_starves_nobody() -> None:
    """A caller with nothing queued comes in first only if every waiting caller was served since it
    was: ten tenants each asking again the moment they are answered cannot starve the one whose lane
    never empties, and each of them waits for a window of every other caller before its next turn."""
    policy = Scheduler(max_batch_size=4, aging_s=0.0)
    policy.solo_from = 1  # every window alone: each batch is one turn's window
    submit(policy, 0.0, Q("F", [10] * 500), caller="flood")
    tenants = [f"t{k}" for k in range(10)]
    for t in tenants:
        submit(policy, 0.0, Q(t, [10]), caller=t)
    served: list[str] = []
    for _ in range(60):
        (window,) = batch(policy, 0.0)
        caller = window.rstrip("0123456789") if window.startswith("F") else window[:-1]
        served.append("flood" if caller == "F" else caller)
        if caller != "F":  # answered: it asks again at once
            submit(policy, 0.0, Q(caller, [10]), caller=caller)
    assert served.count("flood") >= 5  # a window every round of the ten
    for t in tenants:  # between two windows of a tenant, the flood had one
        mine = [i for i, c in enumerate(served) if c == t]
        assert mine and all("flood" in served[a:b] for a, b in zip(mine, mine[1:], strict=False)), served


def test_a_caller_beyond_a_floods_requests_is_within_the_lookahead() -> None:
    """The lookahead counts callers, not requests: one key's 100 queued requests cannot push another
    key's request out of the batches' sight."""
    policy = Scheduler(max_batch_size=4, lookahead=2, aging_s=0.0)
    for k in range(100):
        submit(policy, 0.0, Q(f"x{k}-", [10]), caller="flood")
    submit(policy, 0.0, Q("y", [10]), caller="tenant")
    assert "y0" in batch(policy, 0.0)


def test_served_requests_go_to_the_back_of_the_ring() -> None:
    policy = Scheduler(max_batch_size=2, aging_s=0.0)
    for name in "abc":
        submit(policy, 0.0, Q(name, [10, 10]))
    assert batch(policy, 0.0) == ["a0", "b0"]
    assert batch(policy, 0.0) == ["c0", "a1"]  # c, skipped, was in front; a and b went to the back
    assert batch(policy, 0.0) == ["b1", "c1"]


def test_aging_gives_a_request_that_waited_more_windows_per_round() -> None:
    """Waiting k * aging_s seconds earns up to k + 1 windows per round."""
    policy = Scheduler(max_batch_size=4, aging_s=1.0)
    submit(policy, 0.0, Q("old", [10] * 5))
    submit(policy, 2.0, Q("new", [10] * 5))
    assert batch(policy, 2.0) == ["old0", "old1", "old2", "new0"]
    young = Scheduler(max_batch_size=4, aging_s=1.0)
    submit(young, 0.0, Q("old", [10] * 5))
    submit(young, 0.0, Q("new", [10] * 5))
    assert batch(young, 0.5) == ["old0", "new0", "old1", "new1"]


def test_lookahead_bounds_how_many_requests_a_batch_looks_at() -> None:
    policy = Scheduler(max_batch_size=4, lookahead=2, aging_s=0.0)
    for name in "abc":
        submit(policy, 0.0, Q(name, [10, 10]))
    assert batch(policy, 0.0) == ["a0", "b0", "a1", "b1"]  # c was beyond the lookahead
    assert batch(policy, 0.0) == ["c0", "c1"]


# ---- padding and the wait for a full batch -------------------------------------------------------------


def test_padding_cap_leaves_a_window_for_the_next_batch_in_front() -> None:
    policy = Scheduler(max_batch_size=4, max_padding=0.25, aging_s=0.0)
    submit(policy, 0.0, Q("long", [100]))
    submit(policy, 0.0, Q("short", [10]))
    assert batch(policy, 0.0) == ["long0"]  # 2 x 100 padded tokens for 110 real: over 25%
    assert batch(policy, 0.0) == ["short0"]
    loose = Scheduler(max_batch_size=4, max_padding=10.0, aging_s=0.0)
    submit(loose, 0.0, Q("long", [100]))
    submit(loose, 0.0, Q("short", [10]))
    assert batch(loose, 0.0) == ["long0", "short0"]


def test_windows_that_run_alone_never_share_a_call_and_short_ones_still_group() -> None:
    """Where grouping saves nothing (measured at load), windows of solo_from tokens or more run one per
    call, so another caller's window waits for one of them, not a batch; shorter ones still group."""
    policy = Scheduler(max_batch_size=4, max_padding=10.0, aging_s=0.0)
    policy.solo_from = 100
    submit(policy, 0.0, Q("long", [192] * 3), caller="flood")
    assert batch(policy, 0.0) == ["long0"]  # alone
    submit(policy, 0.0, Q("short", [20, 20]), caller="tenant")
    submit(policy, 0.0, Q("tiny", [10, 10]), caller="third")
    assert batch(policy, 0.0) == ["tiny0", "short0", "tiny1", "short1"]  # grouped, before the long one
    assert batch(policy, 0.0) == ["long1"]
    submit(policy, 0.0, Q("late", [20]), caller="tenant")
    assert batch(policy, 0.0) == ["late0"]  # it waited for one long window, not for a batch of them
    assert batch(policy, 0.0) == ["long2"]
    submit(policy, 0.0, Q("two", [150, 150]), caller="tenant")  # a paragraph's question: two windows
    assert [batch(policy, 0.0) for _ in range(2)] == [["two0"], ["two1"]]  # one turn, in a row
    urgent = _measured(Scheduler(max_batch_size=4, aging_s=0.0))
    urgent.solo_from = 100
    submit(urgent, 0.0, Q("s", [10]))
    submit(urgent, 0.0, Q("L", [192] * 6), deadline=20.0)  # urgent at once: 20 s < 2 x its 15 s of work
    assert batch(urgent, 0.0) == ["L0"]  # urgent, but alone
    assert batch(urgent, 0.0) == ["s0"]  # the ring's turn


def test_the_wait_for_a_full_batch_counts_from_the_first_arrival_and_is_not_repeated() -> None:
    """The window the padding cap left out keeps its arrival time: the next batch does not wait again."""
    policy = Scheduler(max_batch_size=4, max_delay_s=2.0, max_padding=0.25, aging_s=0.0)
    assert policy.fill_deadline() is None  # nothing queued
    submit(policy, 0.0, Q("long", [100]))
    submit(policy, 0.5, Q("short", [10]))
    assert policy.fill_deadline() == 2.0 and not policy.full
    assert batch(policy, 2.0) == ["long0"]
    assert policy.fill_deadline() == 2.5  # from the short one's arrival at 0.5, not from now
    assert batch(policy, 2.5) == ["short0"]
    for no_wait in (Scheduler(max_batch_size=1, max_delay_s=2.0), Scheduler(max_delay_s=0.0)):
        submit(no_wait, 0.0, Q("a", [10]))
        assert no_wait.fill_deadline() is None


# ---- dead questions --------------------------------------------------------------------------------------


def test_a_dead_questions_windows_are_dropped_and_skipped() -> None:
    policy = Scheduler(max_batch_size=4, aging_s=0.0)
    gone, stays = Q("gone", [10] * 3), Q("stays", [10] * 2)
    submit(policy, 0.0, gone, stays)  # one request, two questions
    other = Q("other", [10])
    submit(policy, 0.0, other)
    gone.dead = True  # failed or cancelled; not forgotten yet: skipped when a batch is formed
    assert batch(policy, 0.0) == ["stays0", "other0", "stays1"]
    assert policy.waiting == 3  # gone's windows still count until forgotten
    assert policy.forget(gone) == 3 and policy.waiting == 0 and gone.undispatched == 0
    assert policy.forget(gone) == 0  # once only
    policy.clear_if_idle()
    assert not policy.ring


def test_forget_removes_the_windows_from_the_ring_at_once() -> None:
    policy = Scheduler(max_batch_size=4, aging_s=0.0)
    a, b = Q("a", [10] * 3), Q("b", [10])
    submit(policy, 0.0, a, b)
    assert [q.name for q in policy.queued_questions()] == ["a", "a", "a", "b"]
    a.dead = True
    assert policy.forget(a) == 3 and policy.waiting == 1
    assert [q.name for q in policy.queued_questions()] == ["b"]
    policy.clear_if_idle()  # b still waits
    assert batch(policy, 0.0) == ["b0"]


# ---- deadlines of large requests -----------------------------------------------------------------------


def _measured(policy: Scheduler, seconds_per_token: float = 0.01) -> Scheduler:
    policy.learn_speed(seconds_per_token * 100, 100)
    assert policy.seconds_per_token == pytest.approx(seconds_per_token)
    return policy


def test_speed_is_a_slow_moving_average_and_sets_the_hang_limit() -> None:
    policy = Scheduler()
    assert policy.hang_limit(1000, factor=20.0, floor_s=5.0) == float("inf")  # the first call: no limit
    policy.learn_speed(1.0, 100)
    policy.learn_speed(11.0, 100)  # one slow call barely moves it
    assert policy.seconds_per_token == pytest.approx(0.9 * 0.01 + 0.1 * 0.11)
    policy.learn_speed(5.0, 0)  # no tokens: nothing learned
    assert policy.seconds_per_token == pytest.approx(0.02)
    assert policy.hang_limit(1000, factor=20.0, floor_s=5.0) == pytest.approx(400.0)
    assert policy.hang_limit(1, factor=20.0, floor_s=5.0) == 5.0


def test_a_large_request_that_cannot_meet_its_deadline_is_refused_at_admission() -> None:
    policy = _measured(Scheduler(max_batch_size=4))
    # 6 windows of 100 tokens at 0.01 s/token, holding 3 of 4 slots: 6 * 100 * 0.01 * 4/3 = 8 s.
    first = Q("first", [100] * 6)
    submit(policy, 0.0, first, deadline=10.0)
    assert policy.seconds_left(first.request) == pytest.approx(8.0)  # type: ignore[arg-type]
    with pytest.raises(QueueFull, match=r"6 windows would need ~16.0 s .* deadline is 12.0 s away"):
        submit(policy, 0.0, Q("second", [100] * 6), deadline=12.0)  # behind the first: 16 s
    assert policy.waiting == 6 and len(policy.ring) == 1  # nothing of it was queued
    submit(policy, 0.0, Q("later", [100] * 6), deadline=16.0)
    submit(policy, 0.0, Q("small", [100]), deadline=0.1)  # one batch or less: never refused for it
    assert policy.waiting == 13


def test_a_large_request_takes_all_but_one_slot_once_it_is_urgent() -> None:
    policy = _measured(Scheduler(max_batch_size=4, aging_s=0.0))
    large = Q("L", [100] * 6)  # 8 s of work (see above)
    submit(policy, 0.0, large, deadline=20.0)
    for name in "abcdef":
        submit(policy, 0.0, Q(name, [100] * 3))
    # 20 s left > URGENCY_MARGIN x 8 s: a fair share only.
    assert URGENCY_MARGIN * 8.0 < 20.0
    assert batch(policy, 0.0) == ["L0", "a0", "b0", "c0"]
    assert batch(policy, 6.0) == ["d0", "e0", "f0", "L1"]  # 14 s left, not under 2 x 6.7 s: still fair
    # At 10.0: 10 s left < 2 x 4 windows' 5.3 s of work: it takes 3 of 4 slots, the ring the last one.
    assert batch(policy, 10.0) == ["L2", "L3", "L4", "a1"]
    assert batch(policy, 10.1) == ["L5", "b1", "c1", "d1"]  # urgent until done; the rest is the ring's
    assert batch(policy, 10.2) == ["e1", "f1", "a2", "b2"]


def test_an_urgent_batch_the_padding_cap_kept_the_ring_out_of_owes_the_ring_the_next_one() -> None:
    policy = _measured(Scheduler(max_batch_size=4, aging_s=0.0))
    submit(policy, 0.0, Q("s", [10]))
    submit(policy, 0.0, Q("L", [100, 100, 100, 10, 10, 10]), deadline=10.0)  # urgent at once
    assert batch(policy, 0.0) == ["L0", "L1", "L2"]  # s and L3 would pad past the cap
    assert batch(policy, 0.0) == ["s0", "L3", "L4", "L5"]  # the ring's turn: no urgent windows


def test_work_that_can_no_longer_meet_its_deadline_is_given_up_before_it_runs() -> None:
    policy = _measured(Scheduler(max_batch_size=4, aging_s=0.0))
    late, fine = Q("late", [100] * 6), Q("fine", [100] * 6)
    submit(policy, 0.0, late, deadline=10.0)  # feasible when admitted: 8 s of work
    submit(policy, 0.0, fine, deadline=40.0)
    small = Q("s", [100])
    submit(policy, 0.0, small)
    chosen = policy.next_batch(3.0)  # the backend stalled: 3 + 8 > 10
    assert chosen.unreachable == [late] and "late0" not in names(chosen.windows)
    assert names(chosen.windows) == ["fine0", "s0", "fine1", "fine2"]  # fine is not urgent yet
    assert policy.waiting == 9  # late's windows count until the batcher fails and forgets it
    late.dead = True
    assert policy.forget(late) == 6 and policy.waiting == 3


def test_a_large_request_meets_its_deadline_on_a_saturated_server() -> None:
    """A simulation: 8 clients keep one full window each in the queue, every batch costs its tokens at
    the measured speed, and a request of 30 windows must be answered within 1.5 s. Served as urgent it
    finishes in time while the clients keep getting answers; without a deadline (strict round-robin, one
    slot per ring turn) it would take far longer."""

    def simulate(deadline: float | None) -> tuple[float, int]:
        policy = _measured(Scheduler(max_batch_size=4, max_delay_s=0.0, aging_s=0.0), 1e-4)
        clients = [Q(f"c{k}", [128]) for k in range(8)]
        for c in clients:
            submit(policy, 0.0, c)
        large = Q("L", [128] * 30)
        start = 0.5
        submit(policy, start, large, deadline=None if deadline is None else start + deadline)
        now, answered = start, 0
        while large.undispatched:
            chosen = policy.next_batch(now)
            assert chosen.unreachable == []
            now += 1e-4 * 128 * len(chosen.windows)  # compute-bound: a batch costs its tokens
            for q, _ in chosen.windows:
                if q is not large:  # answered: the client asks again at once
                    answered += 1
                    q.request = None
                    submit(policy, now, q)
        return now - start, answered

    took, answered = simulate(deadline=1.5)
    assert took < 1.5 and answered >= 5
    took_fair, _ = simulate(deadline=None)
    assert took_fair > 1.5
