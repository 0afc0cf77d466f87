"""The micro-batcher's scheduling policy: which waiting windows go into the next backend call.

Plain synchronous code with no clock of its own: every decision that depends on time takes ``now``
(``time.perf_counter()`` seconds in the server, any number in a test). ``server.batching`` owns the
event loop, the futures and the backend; it asks this policy what to admit and what to run next.

Fairness: waiting requests sit in a ring, and a batch takes their windows round-robin, one window per
request per round, so a request of one window is never stuck behind every window of a huge one. With
aging, a request that has waited ``k * aging_s`` seconds gives up to ``k + 1`` windows per round, so a
large request still finishes within its deadline while many small ones keep arriving.
Requests that got a window into the batch move to the back of the ring; one that was skipped stays in
front and starts the next batch (nothing starves). Forming a batch looks at most ``lookahead``
requests, so queue housekeeping costs O(lookahead) per batch, independent of the queue length.

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
pure loss; a window that would exceed the cap waits for the next call. ``max_batch_size=1`` switches
batching off; ``max_delay_s=0`` only stops waiting (windows already queued are still grouped).

Admission is bounded in windows (``max_queue``): beyond it :class:`QueueFull` is raised at once (the
HTTP layer answers 503 + Retry-After) instead of letting latency grow without bound. Windows of a
question that is dead (client gone, deadline passed, another window failed) are skipped when a batch
is formed and leave the count at once through :meth:`Scheduler.forget`.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

URGENCY_MARGIN = 2.0  # a large request is served first once its time left < this x the work ahead of it


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
        self.aging_s = aging_s
        self.ring: deque[Request[Q]] = deque()  # requests with windows waiting, round-robin order
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
        self.ring.append(request)
        self.waiting += n

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
        for request in self.ring:
            for question, _ in list(request.windows):
                yield question

    def clear_if_idle(self) -> None:
        """With no live window waiting, only windows of dead questions can be left: forget them."""
        if not self.waiting:
            self.ring.clear()

    # ---- batch formation ------------------------------------------------------------------------

    def fill_deadline(self) -> float | None:
        """Until when to wait for a full batch (max_delay after the first waiting request's arrival), or
        None when there is nothing to wait for (batching off, no delay, or nothing queued)."""
        if self.max_batch_size <= 1 or self.max_delay_s <= 0 or not self.ring:
            return None
        return self.ring[0].enqueued + self.max_delay_s

    @property
    def full(self) -> bool:
        """Enough windows wait to fill a batch."""
        return self.waiting >= self.max_batch_size

    def next_batch(self, now: float) -> Batch[Q]:
        """Take the urgent windows, then windows round-robin from the first ``lookahead`` requests,
        within the padding cap; the chosen windows leave the queue."""
        batch: Batch[Q] = Batch()
        urgent = [] if self._ring_owed else self._take_urgent(now, batch.unreachable)
        visited: list[Request[Q]] = []
        while self.ring and len(visited) < self.lookahead:
            visited.append(self.ring.popleft())
        try:
            chosen, served = self._take_round_robin(visited, list(urgent), now)
        except BaseException:
            self.ring.extendleft(reversed(visited))  # nothing is lost: a crash fails them from the ring
            raise
        # An urgent batch that left no room for the ring (padding) owes the ring the next batch.
        self._ring_owed = bool(urgent) and len(chosen) == len(urgent) and any(r.windows for r in visited)
        # Skipped requests keep their place in front; served ones go to the back (round-robin).
        front = [r for k, r in enumerate(visited) if k not in served and r.windows]
        back = [r for k, r in enumerate(visited) if k in served and r.windows]
        self.ring.extendleft(reversed(front))
        self.ring.extend(back)
        for question, _ in chosen:
            question.undispatched -= 1
            self.waiting -= 1
        batch.windows = chosen
        return batch

    def _take_round_robin(
        self, visited: list[Request[Q]], chosen: list[tuple[Q, int]], now: float
    ) -> tuple[list[tuple[Q, int]], set[int]]:
        """After the urgent windows in ``chosen``: one window per request per round (more with aging)
        while the batch has room and padding stays under the cap; returns the windows and the indices
        of the requests that gave one."""
        served: set[int] = set()
        blocked: set[int] = set()
        longest = max((window_length(w) for w in chosen), default=0)
        real = sum(window_length(w) for w in chosen)
        quota = [1 + int((now - r.enqueued) / self.aging_s) if self.aging_s > 0 else 1 for r in visited]
        progress = True
        while progress and len(chosen) < self.max_batch_size:
            progress = False
            for k, request in enumerate(visited):
                for _ in range(quota[k]):
                    if k in blocked or len(chosen) == self.max_batch_size:
                        break
                    item = next_live(request)
                    if item is None:
                        blocked.add(k)
                        break
                    length = window_length(item)
                    wider = max(longest, length)
                    if chosen and wider * (len(chosen) + 1) > (1 + self.max_padding) * (real + length):
                        request.windows.appendleft(item)  # too much padding: it leads a later batch
                        blocked.add(k)
                        break
                    chosen.append(item)
                    served.add(k)
                    longest, real = wider, real + length
                    progress = True
        return chosen, served

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
        for request in feasible[: last_urgent + 1]:
            while len(chosen) < room:
                item = next_live(request)
                if item is None:
                    break
                chosen.append(item)
        return chosen


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
