"""Dynamic micro-batching with fair queueing: windows of concurrent requests share one backend call.

A request (one HTTP call: one question, or a batch of them) is submitted as all of its windows. A
collector task in the event loop waits at most ``max_delay_s`` (counted from the first waiting
request's arrival) for ``max_batch_size`` windows, pads the batch to its longest window (not to
``max_seq_len``) and runs the backend in a worker thread, so the event loop keeps accepting requests
while the model runs (onnxruntime and torch release the GIL). While a batch runs, new windows queue up
and form the next batch ("batch while busy"), which is where the throughput gain comes from.

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
at once instead of a 504 after the deadline) or, if the load grew after it was admitted, failed early
with :class:`DeadlineUnreachable`, so no capacity goes to windows whose answer would arrive too late.
This costs O(large requests) per batch, at most ``max_queue / max_batch_size``.

Padding: a window joins only while the batch's padding stays within ``max_padding`` of its real
tokens: on a compute-bound CPU a batch costs about what its windows cost one by one, so padding is
pure loss; a window that would exceed the cap waits for the next call. ``max_batch_size=1`` switches
batching off; ``max_delay_s=0`` only stops waiting (windows already queued are still grouped).

Admission is bounded in windows (``max_queue``): beyond it :class:`QueueFull` is raised at once (the
HTTP layer answers 503 + Retry-After) instead of letting latency grow without bound. Windows of a
question whose future is already done (client gone, deadline passed, another window failed) are
dropped before inference. A backend exception or a non-finite output fails the questions of the
affected windows only.

Health: the watchdog marks the batcher unhealthy while a backend call runs longer than
``watchdog_factor`` times its expected time (from the measured seconds per token, never below
``watchdog_min_s``) and fails that call's questions; a crashed collector makes it unhealthy for good.
``drain()`` finishes everything already admitted (graceful shutdown).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np

from train.squad import Feature, pad_batch

logger = logging.getLogger(__name__)

RunFn = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
URGENCY_MARGIN = 2.0  # a large request is served first once its time left < this x the work ahead of it


class QueueFull(RuntimeError):
    """Too many windows are waiting; retry later."""


class DeadlineUnreachable(RuntimeError):
    """At the measured speed this question's remaining windows cannot finish before its deadline."""


class BatcherClosed(RuntimeError):
    """The server is shutting down and accepts no new work."""


class BatcherUnhealthy(RuntimeError):
    """The collector crashed or a backend call hangs: no new work until it recovers (or a restart)."""


class InferenceError(RuntimeError):
    """The backend call that held this question's windows raised (details are in the server log)."""


class NonFiniteOutput(InferenceError):
    """The backend returned NaN or infinity for one of this question's windows."""


class BackendHung(BatcherUnhealthy):
    """The backend call holding this question's windows exceeded the watchdog's limit."""


@dataclass
class BatchStats:
    """What one backend call looked like (for metrics)."""

    size: int
    padded_length: int
    padding_ratio: float
    seconds: float
    failed: bool = False
    non_finite: int = 0  # windows whose outputs were not finite


@dataclass(eq=False)
class _Job:
    """One question: its windows, their output rows as they arrive, and timing."""

    features: Sequence[Feature]
    future: asyncio.Future
    enqueued: float
    rows: list[dict[str, np.ndarray] | None]
    undispatched: int  # windows still counted in the queue
    remaining: int  # windows without outputs yet
    first_start: float | None = None
    tag: str = ""  # the request id, for the log
    request: _Request | None = None  # whose ring entry holds its queued windows

    @property
    def dead(self) -> bool:
        """Failed, cancelled (client gone, timeout) or done: its remaining windows are skipped."""
        return self.future.done()


@dataclass(eq=False)
class _Request:
    """The waiting windows of one submission, in order; the unit of round-robin fairness."""

    windows: deque[tuple[_Job, int]]
    enqueued: float
    deadline: float | None = None  # time.perf_counter() by which its answer is due
    urgent: bool = False  # served before the ring until done (see "Deadlines" above)


@dataclass
class JobResult:
    """Per-window output rows (each ``{output name: row of the padded batch}``) and the question's timing."""

    rows: list[dict[str, np.ndarray]]
    queue_s: float
    inference_s: float


@dataclass(eq=False)
class _Call:
    """A backend call in flight, for the watchdog."""

    chosen: list[tuple[_Job, int]]
    started: float
    limit_s: float
    hung: bool = False


class MicroBatcher:
    """Groups windows of concurrent requests into backend calls; see the module docstring."""

    def __init__(
        self,
        run: RunFn,
        max_batch_size: int = 8,
        max_delay_s: float = 0.002,
        max_queue: int = 1024,
        workers: int = 1,
        pad_multiple_of: int | None = None,
        min_length: int | None = None,
        max_length: int | None = None,
        lookahead: int | None = None,
        max_padding: float = 0.25,
        aging_s: float = 1.0,
        watchdog_factor: float = 20.0,
        watchdog_min_s: float = 5.0,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_queue_depth: Callable[[int], None] | None = None,
        on_dropped: Callable[[int], None] | None = None,
        on_hang: Callable[[], None] | None = None,
    ) -> None:
        self._run = run
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self.pad_multiple_of = pad_multiple_of
        self.min_length = min_length  # e.g. a TensorRT profile's shortest sequence
        self.max_length = max_length  # pad_multiple_of never rounds past it (the model's max_seq_len)
        self.lookahead = lookahead if lookahead is not None else 4 * max_batch_size
        self.max_padding = max_padding  # padded tokens / real tokens - 1, at most
        self.aging_s = aging_s
        self.watchdog_factor = watchdog_factor
        self.watchdog_min_s = watchdog_min_s
        self._on_batch = on_batch
        self._on_queue_depth = on_queue_depth
        self._on_dropped = on_dropped
        self._on_hang = on_hang
        self._ring: deque[_Request] = deque()  # requests with windows waiting, round-robin order
        self._large: list[_Request] = []  # requests of more than one batch, by deadline
        self._ring_owed = False  # the last batch was all urgent windows: the next one is the ring's
        self._waiting = 0  # windows of live questions not dispatched yet
        self._wakeup = asyncio.Event()
        self.workers = workers
        self._slots = asyncio.Semaphore(workers)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="inference")
        self._running: set[asyncio.Task] = set()
        self._calls: set[_Call] = set()
        self._seconds_per_token: float | None = None  # measured; sets the watchdog's expectation
        self._closed = False
        self.crashed = False
        self._collector: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None

    # ---- public API ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the collector and watchdog tasks (inside a running event loop)."""
        if self._collector is None:
            loop = asyncio.get_running_loop()
            self._collector = loop.create_task(self._collect(), name="micro-batcher")
            self._collector.add_done_callback(self._collector_done)
            self._watchdog = loop.create_task(self._watch(), name="batcher-watchdog")

    def _collector_done(self, task: asyncio.Task) -> None:
        """If the collector ever dies, fail what is queued and stay unhealthy (never a silent 503)."""
        if task.cancelled() or task.exception() is None:
            return
        logger.error("micro-batcher collector crashed", exc_info=task.exception())
        self.crashed = True
        self._fail_queued(BatcherUnhealthy("the micro-batcher crashed"))

    @property
    def healthy(self) -> bool:
        """False after a collector crash or while a backend call is overdue."""
        return not self.crashed and not any(c.hung for c in self._calls)

    @property
    def busy(self) -> bool:
        """A backend call is running (possibly one the watchdog gave up on)."""
        return bool(self._calls)

    @property
    def queued(self) -> int:
        """Windows of live questions waiting for a backend call."""
        return self._waiting

    def check_admission(self, windows: int = 1) -> None:
        """Raise BatcherClosed, BatcherUnhealthy or QueueFull if ``windows`` more could not be queued now
        (the pipeline asks with 1 before tokenizing, so a full queue costs a request no work)."""
        if self._closed:
            raise BatcherClosed("the server is shutting down")
        if not self.healthy:
            raise BatcherUnhealthy("the inference backend is unhealthy")
        if self._waiting + windows > self.max_queue:
            raise QueueFull(
                f"{self._waiting} windows are waiting and this request has {windows} (limit {self.max_queue})"
            )

    def submit_many(
        self, groups: Sequence[Sequence[Feature]], tag: str = "", deadline: float | None = None
    ) -> list[asyncio.Future]:
        """Admit one request's questions at once, all or none (a batch request is never half-queued).

        ``deadline`` (``time.perf_counter()`` time) lets a large request be scheduled to meet it. Returns
        one future per question resolving to a :class:`JobResult`. Raises QueueFull, BatcherClosed or
        BatcherUnhealthy without queueing anything.
        """
        if any(not features for features in groups):
            raise ValueError("a question needs at least one window")
        n = sum(len(features) for features in groups)
        self.check_admission(n)
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        request = _Request(deque(), now, deadline)
        futures = []
        for features in groups:
            k = len(features)
            job = _Job(features, loop.create_future(), now, [None] * k, k, k, tag=tag, request=request)
            job.future.add_done_callback(
                cast("Callable[[asyncio.Future], None]", lambda _, job=job: self._forget(job))
            )
            request.windows.extend((job, i) for i in range(k))
            futures.append(job.future)
        if deadline is not None and n > self.max_batch_size:
            self._admit_large(request, now)  # may raise QueueFull: nothing is queued yet
        self._ring.append(request)
        self._waiting += n
        self._depth_changed()
        self._wakeup.set()
        return futures

    async def submit(self, features: Sequence[Feature]) -> JobResult:
        """Queue one question's windows and wait for all of their outputs."""
        future = self.submit_many([features])[0]
        return await future

    async def drain(self, timeout: float | None = None) -> None:
        """Refuse new work, finish admitted work (at most ``timeout`` s), stop the tasks and threads."""
        self._closed = True
        self._wakeup.set()
        if self._collector is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):  # timeout, or a crash already logged
                await asyncio.wait_for(asyncio.shield(self._collector), timeout)
            self._collector.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.abort(BatcherClosed("the server shut down before this question was answered"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    def abort(self, error: Exception) -> None:
        """Refuse new work and fail every admitted question now (queued or in a running call)."""
        self._closed = True
        self._wakeup.set()
        self._fail_queued(error)
        for call in self._calls:
            for job, _ in call.chosen:
                self._fail_job(job, error)

    # ---- queue bookkeeping --------------------------------------------------------------------

    def _depth_changed(self) -> None:
        if self._on_queue_depth is not None:
            self._on_queue_depth(self._waiting)

    def _forget(self, job: _Job) -> None:
        """A question died (cancelled, timed out, failed): its queued windows leave the queue at once,
        in time linear in its request's windows (an answered question has none left)."""
        if job.undispatched:
            if self._on_dropped is not None:
                self._on_dropped(job.undispatched)
            self._waiting -= job.undispatched
            job.undispatched = 0
            if job.request is not None:
                job.request.windows = deque(w for w in job.request.windows if w[0] is not job)
            self._depth_changed()

    def _next_live(self, request: _Request) -> tuple[_Job, int] | None:
        """Pop ``request``'s next window of a live question (dead ones are discarded on the way)."""
        while request.windows:
            job, i = request.windows.popleft()
            if not job.dead:
                return job, i
        return None

    # ---- collector ------------------------------------------------------------------------------

    async def _collect(self) -> None:
        while True:
            if not self._waiting:
                self._ring.clear()  # only windows of dead questions can be left
                if self._closed and not self._running:
                    return
                self._wakeup.clear()
                if self._closed:
                    await asyncio.wait(self._running)
                    continue
                await self._wakeup.wait()
                continue
            await self._slots.acquire()
            try:
                batch = await self._form_batch()
            except BaseException:
                self._slots.release()
                raise
            if not batch:  # only windows of dead questions were left: let their callbacks run
                self._slots.release()
                await asyncio.sleep(0)
                continue
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _wait_for_fill(self) -> None:
        """Wait up to max_delay, counted from the first waiting request's arrival, for a full batch."""
        if self.max_batch_size <= 1 or self.max_delay_s <= 0 or not self._ring:
            return
        deadline = self._ring[0].enqueued + self.max_delay_s
        while self._waiting < self.max_batch_size and not self._closed:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), left)

    async def _form_batch(self) -> list[tuple[_Job, int]]:
        """Take windows round-robin from the first ``lookahead`` requests, within the padding cap."""
        await self._wait_for_fill()
        urgent = [] if self._ring_owed else self._take_urgent()
        visited: list[_Request] = []
        while self._ring and len(visited) < self.lookahead:
            visited.append(self._ring.popleft())
        try:
            chosen, served = self._take_round_robin(visited, list(urgent))
        except BaseException:
            self._ring.extendleft(reversed(visited))  # nothing is lost: a crash fails them from the ring
            raise
        # An urgent batch that left no room for the ring (padding) owes the ring the next batch.
        self._ring_owed = bool(urgent) and len(chosen) == len(urgent) and any(r.windows for r in visited)
        # Skipped requests keep their place in front; served ones go to the back (round-robin).
        front = [r for k, r in enumerate(visited) if k not in served and r.windows]
        back = [r for k, r in enumerate(visited) if k in served and r.windows]
        self._ring.extendleft(reversed(front))
        self._ring.extend(back)
        now = time.perf_counter()
        for job, _ in chosen:
            if job.first_start is None:
                job.first_start = now
            job.undispatched -= 1
            self._waiting -= 1
        self._depth_changed()
        return chosen

    def _take_round_robin(
        self, visited: list[_Request], chosen: list[tuple[_Job, int]]
    ) -> tuple[list[tuple[_Job, int]], set[int]]:
        """After the urgent windows in ``chosen``: one window per request per round while the batch has
        room and padding stays under the cap; returns the windows and the indices of the requests that
        gave one."""
        served: set[int] = set()
        blocked: set[int] = set()
        longest = max((len(job.features[i]) for job, i in chosen), default=0)
        real = sum(len(job.features[i]) for job, i in chosen)
        now = time.perf_counter()
        quota = [1 + int((now - r.enqueued) / self.aging_s) if self.aging_s > 0 else 1 for r in visited]
        progress = True
        while progress and len(chosen) < self.max_batch_size:
            progress = False
            for k, request in enumerate(visited):
                for _ in range(quota[k]):
                    if k in blocked or len(chosen) == self.max_batch_size:
                        break
                    item = self._next_live(request)
                    if item is None:
                        blocked.add(k)
                        break
                    length = len(item[0].features[item[1]])
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

    # ---- deadlines of large requests ---------------------------------------------------------------------

    def _seconds_left(self, request: _Request) -> float:
        """Estimated backend time for ``request``'s waiting windows while it holds all but one slot."""
        if self._seconds_per_token is None or not request.windows:
            return 0.0
        job, i = request.windows[0]
        share = self.max_batch_size / max(1, self.max_batch_size - 1)
        return len(request.windows) * len(job.features[i]) * self._seconds_per_token * share

    def _admit_large(self, request: _Request, now: float) -> None:
        """Queue ``request`` in deadline order, or raise QueueFull if, after the large requests due
        before it, it could not finish by its deadline."""
        assert request.deadline is not None
        self._large = [r for r in self._large if r.windows]
        # every request in _large was admitted with a deadline
        ahead = sum(self._seconds_left(r) for r in self._large if cast(float, r.deadline) <= request.deadline)
        need = ahead + self._seconds_left(request)
        if now + need > request.deadline:
            raise QueueFull(
                f"this request's {len(request.windows)} windows would need ~{need:.1f} s at the current "
                f"load but its deadline is {request.deadline - now:.1f} s away"
            )
        keys = [cast(float, r.deadline) for r in self._large]
        self._large.insert(bisect.bisect_right(keys, request.deadline), request)

    def _take_urgent(self) -> list[tuple[_Job, int]]:
        """Windows of the large requests that must run now to meet their deadlines (earliest deadline
        first, all but one slot); fails those that can no longer make it."""
        self._large = [r for r in self._large if r.windows]
        if not self._large or self._seconds_per_token is None:
            return []
        now = time.perf_counter()
        work, last_urgent, feasible = 0.0, -1, []
        for request in self._large:
            need = self._seconds_left(request)
            if now + work + need > request.deadline:  # type: ignore[operator]
                self._fail_request(
                    request, DeadlineUnreachable("this question could not be answered within its deadline")
                )
                continue
            work += need
            feasible.append(request)
            if request.urgent or request.deadline - now < URGENCY_MARGIN * work:  # type: ignore[operator]
                request.urgent = True  # stays so until done: it keeps the margin it was given
                last_urgent = len(feasible) - 1
        room = self.max_batch_size - 1 if self.max_batch_size > 1 else 1
        chosen: list[tuple[_Job, int]] = []
        for request in feasible[: last_urgent + 1]:
            while len(chosen) < room:
                item = self._next_live(request)
                if item is None:
                    break
                chosen.append(item)
        return chosen

    def _fail_request(self, request: _Request, error: Exception) -> None:
        for job in {job for job, _ in request.windows}:
            self._fail_job(job, error)

    def _expected_seconds(self, tokens: int) -> float:
        """How long a call of ``tokens`` padded tokens may take before the watchdog calls it hung (the
        first call, which measures the speed, has no limit: a hang there keeps the server not ready)."""
        if self._seconds_per_token is None:
            return float("inf")
        return max(self.watchdog_min_s, self.watchdog_factor * self._seconds_per_token * tokens)

    async def _execute(self, chosen: list[tuple[_Job, int]]) -> None:
        start = time.perf_counter()
        batch: dict[str, np.ndarray] | None = None
        call: _Call | None = None
        try:
            features = [job.features[i] for job, i in chosen]
            pad_to = max(self.min_length, max(len(f) for f in features)) if self.min_length else None
            batch = pad_batch(
                features, pad_to=pad_to, multiple_of=self.pad_multiple_of, max_length=self.max_length
            )
            inputs = {k: batch[k] for k in MODEL_INPUTS}
            call = _Call(chosen, start, self._expected_seconds(int(inputs["input_ids"].size)))
            self._calls.add(call)
            outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._run, inputs)
        except Exception:  # noqa: BLE001 - any backend failure fails this batch only
            tags = sorted({job.tag for job, _ in chosen})
            logger.exception("backend call failed for a batch of %d windows (requests %s)", len(chosen), tags)
            self._fail(chosen, InferenceError("the inference backend failed on this request's batch"))
            self._stats(batch, len(chosen), time.perf_counter() - start, failed=True)
            return
        finally:
            if call is not None:
                self._calls.discard(call)
            self._slots.release()
            self._wakeup.set()
        try:
            self._deliver(chosen, call, batch, outputs, start)
        except Exception:  # noqa: BLE001 - outputs of an unexpected shape: fail the batch, never leave it
            logger.exception("backend outputs of a batch of %d windows could not be read", len(chosen))
            self._fail(chosen, InferenceError("the inference backend returned unreadable outputs"))

    def _deliver(
        self,
        chosen: list[tuple[_Job, int]],
        call: _Call,
        batch: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
        start: float,
    ) -> None:
        """Hand each window its output row; a question is answered when all of its windows are."""
        end = time.perf_counter()
        if call.hung:
            logger.warning("a backend call the watchdog had given up on returned after %.1f s", end - start)
        else:
            self._learn_speed(end - start, int(batch["input_ids"].size))
        finite = _finite_rows(outputs, len(chosen))
        self._stats(batch, len(chosen), end - start, non_finite=int((~finite).sum()))
        for row, (job, i) in enumerate(chosen):
            if job.dead:
                continue
            if not finite[row]:
                logger.error("non-finite backend output for window %d of request %s", i, job.tag)
                self._fail_job(
                    job, NonFiniteOutput("the model produced a non-finite output for this question")
                )
                continue
            job.rows[i] = {name: value[row] for name, value in outputs.items()}
            job.remaining -= 1
            if job.remaining == 0:
                first = job.first_start if job.first_start is not None else end
                job.future.set_result(JobResult(job.rows, first - job.enqueued, end - first))  # type: ignore[arg-type]

    def _learn_speed(self, seconds: float, tokens: int) -> None:
        """Seconds per padded token, a slowly moving average (one slow call barely moves it)."""
        if tokens <= 0:
            return
        rate = seconds / tokens
        old = self._seconds_per_token
        self._seconds_per_token = rate if old is None else 0.9 * old + 0.1 * rate

    # ---- watchdog -------------------------------------------------------------------------------

    async def _watch(self) -> None:
        interval = max(0.05, min(0.5, self.watchdog_min_s / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.perf_counter()
            for call in list(self._calls):
                if not call.hung and now - call.started > call.limit_s:
                    call.hung = True
                    logger.error(
                        "backend call of %d windows still running after %.1f s (limit %.1f s): unhealthy",
                        len(call.chosen), now - call.started, call.limit_s,
                    )  # fmt: skip
                    self._fail(call.chosen, BackendHung("the inference backend stopped responding"))
                    if self._on_hang is not None:
                        self._on_hang()
            if self._calls and sum(c.hung for c in self._calls) >= self.workers:
                # Every inference slot is held by a hung call: what waits would only reach its deadline.
                self._fail_queued(BackendHung("the inference backend stopped responding"))

    # ---- failures and stats ---------------------------------------------------------------------

    def _fail_job(self, job: _Job, error: Exception) -> None:
        if not job.dead:
            job.future.set_exception(error)
            job.future.exception()  # retrieved: a question nobody awaits any more is not "never retrieved"

    def _fail_queued(self, error: Exception) -> None:
        """Fail every question with windows in the ring (their callbacks bring the queue count down)."""
        for request in self._ring:
            for job, _ in list(request.windows):
                self._fail_job(job, error)

    def _fail(self, chosen: list[tuple[_Job, int]], error: Exception) -> None:
        for job, _ in chosen:
            self._fail_job(job, error)

    def _stats(
        self,
        batch: dict[str, np.ndarray] | None,
        size: int,
        seconds: float,
        failed: bool = False,
        non_finite: int = 0,
    ) -> None:
        if self._on_batch is None or batch is None:
            return
        mask = batch["attention_mask"]
        ratio = 1.0 - float(mask.sum()) / float(mask.size) if mask.size else 0.0
        self._on_batch(BatchStats(size, int(mask.shape[1]), ratio, seconds, failed, non_finite))


def _finite_rows(outputs: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """Per batch row: are all of its floating-point outputs finite?"""
    ok = np.ones(rows, dtype=bool)
    for value in outputs.values():
        if np.issubdtype(value.dtype, np.floating):
            ok &= np.isfinite(value.reshape(rows, -1)).all(axis=1)
    return ok
