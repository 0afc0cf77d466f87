"""The micro-batcher's scheduling policy: which waiting windows go into the next backend call.

Plain synchronous code with no clock of its own: every decision that depends on time takes ``now``
(``time.perf_counter()`` seconds in the server, any number in a test). ``server.answering.batching`` owns the
event loop, the futures and the backend; it asks this policy what to admit and what to run next.

Fairness, by caller first: waiting requests sit in lanes, one per caller (an API key's name), and
the lanes in a ring. A batch takes windows lane by lane, one lane's turn per round: a caller with
sixteen requests queued gets a turn as often as a caller with one, so one key's flood of batches
never pushes another key's question back by more than a turn per round. Within a lane the caller's
own requests take turns the same way, so a caller's one-window question is not stuck behind every
window of its own huge one (with a single caller, the server without keys, this is plain
round-robin over requests). With aging, a request that has waited ``k * aging_s`` seconds gives up
to ``k + 1`` windows on its turn, so a large request still finishes within its deadline while many
small ones keep arriving. A lane's turn is ``TURN_WINDOWS`` windows (where windows run one per call,
a question about one paragraph, one or two windows, runs without another caller's window between its
own); lanes (and requests in a lane) that had their turn move to the back; one that was skipped stays
in front and starts the next batch (nothing starves). A caller that had nothing waiting comes in at
the front if every caller waiting has been served since it was (a sleeper's credit, as Linux's CFS
gives a waking task): a tenant sending one question at a time waits for the call in flight, not for
another turn of a tenant whose lane never empties; one that comes back the moment it is answered waits
one window of each other caller first, so its share stays bounded and nobody waiting is passed over. Forming a batch looks at
most ``lookahead`` lanes and ``lookahead`` requests in each, so queue housekeeping per batch is
bounded, independent of the queue length.

Deadlines: a fair share is not enough for a request of many windows while the server is saturated:
it would reach its deadline with half of its windows done. Requests of more than one batch of windows
are also kept in deadline order, with an estimate of their remaining work (measured seconds per token).
Once the time a large request has left is under ``URGENCY_MARGIN`` times the work of it and every large
request due before it, those requests (from then on until they are done) take all but one slot of
each batch, earliest deadline first (the fair ring keeps the last slot, or the next batch when the
padding cap kept its windows out, so small requests still progress). A large request that could not
finish by its deadline even if served alone is refused at admission (:class:`QueueFull`, so 503 + Retry-After
at once instead of a 504 after the deadline) or, if the load grew after it was admitted, given up
early (:attr:`Batch.unreachable`; the batcher fails it with :class:`DeadlineUnreachable`), so no
capacity goes to windows whose answer would arrive too late.
This costs O(large requests) per batch, at most ``max_queue / max_batch_size``.

Padding: a window joins only while the batch's padding stays within ``max_padding`` of its real
tokens: on a compute-bound CPU a batch costs about what its windows cost one by one, so padding is
pure loss; a window that would exceed the cap waits for the next call. Where grouping saves nothing
(measured at load, :mod:`server.answering.batch_curve`), windows of ``solo_from`` tokens or more run one per
call: a batch of them would only make a newcomer wait for all of them. ``max_batch_size=1`` switches
batching off; ``max_delay_s=0`` only stops waiting (windows already queued are still grouped).

Admission is bounded in windows (``max_queue``): beyond it :class:`QueueFull` is raised at once (the
HTTP layer answers 503 + Retry-After) instead of letting latency grow without bound. Windows of a
question that is dead (client gone, deadline passed, another window failed) are skipped when a batch
is formed and leave the count at once through :meth:`Scheduler.forget`.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

URGENCY_MARGIN = 2.0  # a large request is served first once its time left < this x the work ahead of it
TURN_WINDOWS = 2  # windows a caller takes in a row before the next caller's turn (a paragraph's question)
MAX_REMEMBERED_CALLERS = 4096  # callers whose last service the policy remembers (keys are far fewer)


class QueueFull(RuntimeError):
    """Too many windows are waiting; retry later."""


class DeadlineUnreachable(RuntimeError):
    """At the measured speed this question's remaining windows cannot finish before its deadline."""


class QueuedQuestion(Protocol):
    """What the policy needs of a queued question (the host path's ``Question`` is one): its windows'
    lengths, whether it is still wanted, how many of its windows are still queued, and the request that
    holds them."""

    @property
    def features(self) -> Sequence[Sized]: ...

    @property
    def dead(self) -> bool: ...

    undispatched: int
    request: Request[Any] | None


Q = TypeVar("Q", bound=QueuedQuestion)


@dataclass(eq=False)
class Request(Generic[Q]):
    """The waiting windows of one submission, in order; the unit of round-robin fairness."""

    windows: deque[tuple[Q, int]]
    enqueued: float
    deadline: float | None = None  # in the policy's clock, by which its answer is due
    urgent: bool = False  # served before the ring until done (see "Deadlines" above)
    caller: str = ""  # whose lane it waits in (an API key's name)


@dataclass(eq=False)
class Lane(Generic[Q]):
    """One caller's waiting requests, in turn order; the unit of the ring's round-robin."""

    caller: str
    requests: deque[Request[Q]] = field(default_factory=deque)
    turn_left: int = 0  # windows this caller may still take before the next caller's turn

    @property
    def has_work(self) -> bool:
        return any(r.windows for r in self.requests)


@dataclass
class Batch(Generic[Q]):
    """The windows of the next backend call, and the questions of large requests given up on while
    choosing them (their windows are already out of the ring; the caller fails them)."""

    windows: list[tuple[Q, int]] = field(default_factory=list)
    unreachable: list[Q] = field(default_factory=list)


def window_length(window: tuple[QueuedQuestion, int]) -> int:
    question, i = window
    return len(question.features[i])


class Scheduler(Generic[Q]):
    """Admission, fair shares, aging, deadlines and batch formation; see the module docstring."""

    def __init__(
        self,
        max_batch_size: int = 8,
        max_delay_s: float = 0.002,
        max_queue: int = 1024,
        lookahead: int | None = None,
        max_padding: float = 0.25,
        aging_s: float = 1.0,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self.lookahead = lookahead if lookahead is not None else 4 * max_batch_size
        self.max_padding = max_padding  # padded tokens / real tokens - 1, at most
        self.solo_from: int | None = None  # windows this long run alone (grouping them does not pay)
        self.aging_s = aging_s
        self.ring: deque[Lane[Q]] = deque()  # callers with windows waiting, round-robin order
        self._lanes: dict[str, Lane[Q]] = {}  # the ring's lanes by caller
        self._formed = 0  # batches formed so far
        self._served_at: dict[str, int] = {}  # caller -> the batch it last gave a window to
        self._large: list[Request[Q]] = []  # requests of more than one batch, by deadline
        self._ring_owed = False  # the last batch was all urgent windows: the next one is the ring's
        self.waiting = 0  # windows of live questions not dispatched yet
        self.seconds_per_token: float | None = None  # measured backend speed

    # ---- admission ------------------------------------------------------------------------------

    def check_queue(self, windows: int) -> None:
        """Raise QueueFull if ``windows`` more would not fit in the queue now."""
        if self.waiting + windows > self.max_queue:
            raise QueueFull(
                f"{self.waiting} windows are waiting and this request has {windows} (limit {self.max_queue})"
            )

    def admit(self, request: Request[Q], now: float) -> None:
        """Queue ``request`` (all of its windows), or raise QueueFull without queueing anything when it
        is a large request with a deadline it could not meet behind the large requests due before it."""
        n = len(request.windows)
        if request.deadline is not None and n > self.max_batch_size:
            self._admit_large(request, now)
        lane = self._lanes.get(request.caller)
        if lane is None:
            lane = self._lanes[request.caller] = Lane(request.caller, turn_left=TURN_WINDOWS)
            if self._sat_out(request.caller):  # it has its turn first
                self.ring.appendleft(lane)
            else:
                self.ring.append(lane)
        lane.requests.append(request)
        self.waiting += n

    def _sat_out(self, caller: str) -> bool:
        """Whether every caller waiting now has been served since ``caller`` was last (or it never was):
        then ``caller``, having nothing queued, comes in at the front. A caller that keeps coming back
        the moment it is answered thus waits for one window of each other caller first, and no caller
        waiting in the ring can be passed over twice by the same newcomer (nobody starves)."""
        last = self._served_at.get(caller)
        return last is None or all(self._served_at.get(lane.caller, -1) > last for lane in self.ring)

    def forget(self, question: Q) -> int:
        """A question died: its queued windows leave the queue at once, in time linear in its request's
        windows. Returns how many were dropped (none for an answered question)."""
        dropped = question.undispatched
        if dropped:
            self.waiting -= dropped
            question.undispatched = 0
            if question.request is not None:
                request = question.request
                request.windows = deque(w for w in request.windows if w[0] is not question)
        return dropped

    def queued_questions(self) -> Iterator[Q]:
        """Every question with a window in the ring (repeated once per window)."""
        for lane in self.ring:
            for request in lane.requests:
                for question, _ in list(request.windows):
                    yield question

    def clear_if_idle(self) -> None:
        """With no live window waiting, only windows of dead questions can be left: forget them."""
        if not self.waiting:
            self.ring.clear()
            self._lanes.clear()

    # ---- batch formation ------------------------------------------------------------------------

    def fill_deadline(self) -> float | None:
        """Until when to wait for a full batch (max_delay after the first waiting request's arrival), or
        None when there is nothing to wait for (batching off, no delay, or nothing queued)."""
        if self.max_batch_size <= 1 or self.max_delay_s <= 0 or not self.ring:
            return None
        first = min((lane.requests[0].enqueued for lane in self.ring if lane.requests), default=None)
        return None if first is None else first + self.max_delay_s

    @property
    def full(self) -> bool:
        """Enough windows wait to fill a batch."""
        return self.waiting >= self.max_batch_size

    def next_batch(self, now: float) -> Batch[Q]:
        """Take the urgent windows, then windows lane by lane from the first ``lookahead`` lanes (and
        requests in each), within the padding cap; the chosen windows leave the queue."""
        batch: Batch[Q] = Batch()
        urgent = [] if self._ring_owed else self._take_urgent(now, batch.unreachable)
        lanes: list[Lane[Q]] = []
        while self.ring and len(lanes) < self.lookahead:
            lanes.append(self.ring.popleft())
        visits = [_pop_front(lane.requests, self.lookahead) for lane in lanes]
        try:
            chosen, served = self._take_round_robin(visits, list(urgent), now)
        except BaseException:  # nothing is lost: a crash fails them from the ring
            for lane, requests in zip(lanes, visits, strict=True):
                lane.requests.extendleft(reversed(requests))
            self.ring.extendleft(reversed(lanes))
            raise
        # An urgent batch that left no room for the ring (padding) owes the ring the next batch.
        self._ring_owed = (
            bool(urgent) and len(chosen) == len(urgent) and any(r.windows for v in visits for r in v)
        )
        # Skipped lanes and requests keep their place in front; served ones go to the back.
        for i, (lane, requests) in enumerate(zip(lanes, visits, strict=True)):
            _requeue(lane.requests, [(r, (i, k) in served) for k, r in enumerate(requests) if r.windows])
        for lane in lanes:
            if not lane.has_work:
                del self._lanes[lane.caller]
        given = Counter(q.request.caller for q, _ in chosen if q.request is not None)
        for caller in given:
            self._served_at[caller] = self._formed
        self._formed += 1
        if len(self._served_at) > MAX_REMEMBERED_CALLERS:  # the longest unserved are forgotten
            for caller, _ in sorted(self._served_at.items(), key=lambda kv: kv[1])[
                : MAX_REMEMBERED_CALLERS // 2
            ]:
                del self._served_at[caller]
        _requeue(
            self.ring,
            [
                (lane, self._turn_over(lane, given[lane.caller]))
                for lane in lanes
                if lane.caller in self._lanes
            ],
        )
        for question, _ in chosen:
            question.undispatched -= 1
            self.waiting -= 1
        batch.windows = chosen
        return batch

    def _turn_over(self, lane: Lane[Q], given: int) -> bool:
        """Whether ``lane``, which gave ``given`` windows to this batch, goes to the back of the ring:
        once it has given ``TURN_WINDOWS`` since its turn began (a caller's question of one or two
        windows runs without another caller's window between its own, where windows run one per call)."""
        if not given:
            return False
        lane.turn_left -= given
        if lane.turn_left > 0:
            return False
        lane.turn_left = TURN_WINDOWS
        return True

    def _take_round_robin(
        self, visits: list[list[Request[Q]]], chosen: list[tuple[Q, int]], now: float
    ) -> tuple[list[tuple[Q, int]], set[tuple[int, int]]]:
        """After the urgent windows in ``chosen``: one lane's turn per round, in which its next request
        gives one window (more with aging), while the batch has room and padding stays under the cap;
        returns the windows and the (lane, request) indices that gave one."""
        served: set[tuple[int, int]] = set()
        blocked: set[tuple[int, int]] = set()
        longest = max((window_length(w) for w in chosen), default=0)
        real = sum(window_length(w) for w in chosen)
        turn = [0] * len(visits)

        def give(i: int, k: int) -> bool:
            """Request ``k`` of lane ``i`` gives its quota, or as much as it can; True if any."""
            nonlocal longest, real
            request = visits[i][k]
            quota = 1 + int((now - request.enqueued) / self.aging_s) if self.aging_s > 0 else 1
            gave = False
            for _ in range(quota):
                if len(chosen) == self.max_batch_size:
                    break
                item = next_live(request)
                if item is None:
                    blocked.add((i, k))
                    break
                length = window_length(item)
                wider = max(longest, length)
                if chosen and not self._may_join(len(chosen), wider, real + length):
                    request.windows.appendleft(item)  # too much padding, or alone: it leads a later batch
                    blocked.add((i, k))
                    break
                chosen.append(item)
                longest, real, gave = wider, real + length, True
            return gave

        progress = True
        while progress and len(chosen) < self.max_batch_size:
            progress = False
            for i, requests in enumerate(visits):
                if len(chosen) == self.max_batch_size:
                    break
                for _ in range(len(requests)):  # the lane's turn: its next request that can give
                    k = turn[i] % len(requests)
                    turn[i] += 1
                    if (i, k) not in blocked and give(i, k):
                        served.add((i, k))
                        progress = True
                        break
        return chosen, served

    def _may_join(self, chosen: int, wider: int, real: int) -> bool:
        """Whether a batch of ``chosen`` windows may take one more, making it ``wider`` tokens long with
        ``real`` real tokens: within the padding cap, and not windows that run alone."""
        if self.solo_from is not None and wider >= self.solo_from:
            return False
        return wider * (chosen + 1) <= (1 + self.max_padding) * real

    # ---- deadlines of large requests ------------------------------------------------------------

    def learn_speed(self, seconds: float, tokens: int) -> None:
        """Seconds per padded token, a slowly moving average (one slow call barely moves it)."""
        if tokens <= 0:
            return
        rate = seconds / tokens
        old = self.seconds_per_token
        self.seconds_per_token = rate if old is None else 0.9 * old + 0.1 * rate

    def hang_limit(self, tokens: int, factor: float, floor_s: float) -> float:
        """How long a call of ``tokens`` padded tokens may take before the watchdog calls it hung:
        ``factor`` times its expected time, at least ``floor_s`` (the first call, which measures the
        speed, has no limit: a hang there keeps the server not ready)."""
        if self.seconds_per_token is None:
            return float("inf")
        return max(floor_s, factor * self.seconds_per_token * tokens)

    def seconds_left(self, request: Request[Q]) -> float:
        """Estimated backend time for ``request``'s waiting windows while it holds all but one slot."""
        if self.seconds_per_token is None or not request.windows:
            return 0.0
        share = self.max_batch_size / max(1, self.max_batch_size - 1)
        return len(request.windows) * window_length(request.windows[0]) * self.seconds_per_token * share

    def _admit_large(self, request: Request[Q], now: float) -> None:
        """Queue ``request`` in deadline order, or raise QueueFull if, after the large requests due
        before it, it could not finish by its deadline."""
        deadline = request.deadline
        assert deadline is not None
        self._large = [r for r in self._large if r.windows]
        ahead = sum(self.seconds_left(r) for r in self._large if _due(r) <= deadline)
        need = ahead + self.seconds_left(request)
        if now + need > deadline:
            raise QueueFull(
                f"this request's {len(request.windows)} windows would need ~{need:.1f} s at the current "
                f"load but its deadline is {deadline - now:.1f} s away"
            )
        keys = [_due(r) for r in self._large]
        self._large.insert(bisect.bisect_right(keys, deadline), request)

    def _take_urgent(self, now: float, unreachable: list[Q]) -> list[tuple[Q, int]]:
        """Windows of the large requests that must run now to meet their deadlines (earliest deadline
        first, all but one slot). The questions of those that can no longer make it go to
        ``unreachable``, their windows out of the ring (they count as waiting until forgotten)."""
        self._large = [r for r in self._large if r.windows]
        if not self._large or self.seconds_per_token is None:
            return []
        work, last_urgent, feasible = 0.0, -1, []
        for request in self._large:
            need = self.seconds_left(request)
            if now + work + need > _due(request):
                unreachable.extend(dict.fromkeys(question for question, _ in request.windows))
                request.windows = deque()
                continue
            work += need
            feasible.append(request)
            if request.urgent or _due(request) - now < URGENCY_MARGIN * work:
                request.urgent = True  # stays so until done: it keeps the margin it was given
                last_urgent = len(feasible) - 1
        room = self.max_batch_size - 1 if self.max_batch_size > 1 else 1
        chosen: list[tuple[Q, int]] = []
        longest = 0
        for request in feasible[: last_urgent + 1]:
            while len(chosen) < room:
                item = next_live(request)
                if item is None:
                    break
                longest = max(longest, window_length(item))
                if chosen and self.solo_from is not None and longest >= self.solo_from:
                    request.windows.appendleft(item)  # it runs alone: the next batch
                    return chosen
                chosen.append(item)
        return chosen


T = TypeVar("T")


def _pop_front(items: deque[T], n: int) -> list[T]:
    """Up to ``n`` items off the front of ``items``."""
    return [items.popleft() for _ in range(min(n, len(items)))]


def _requeue(queue: deque[T], visited: list[tuple[T, bool]]) -> None:
    """Put visited items back (each with whether it was served): the others in front, in their order,
    the served at the back."""
    queue.extendleft(reversed([item for item, served in visited if not served]))
    queue.extend(item for item, served in visited if served)


def next_live(request: Request[Q]) -> tuple[Q, int] | None:
    """Pop ``request``'s next window of a live question (dead ones are discarded on the way)."""
    while request.windows:
        question, i = request.windows.popleft()
        if not question.dead:
            return question, i
    return None


def _due(request: Request[Any]) -> float:
    """The deadline of a large request (every one was admitted with a deadline)."""
    assert request.deadline is not None
    return request.deadline
