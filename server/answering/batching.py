"""Dynamic micro-batching: windows of concurrent requests share one backend call.

A request (one HTTP call: one question, or a batch of them) is submitted as all of its windows. A
collector task in the event loop hands waiting windows to the backend as soon as an inference slot is
free and the engine is idle: a lone request never waits for company (continuous batching, as Triton's
dynamic batcher and vLLM's scheduler do). While a backend call runs, new windows queue up and form the
next call ("batch while busy"), which is where the throughput gain comes from. Only with more than
one inference slot, while another call is in flight, does the collector wait for a fuller batch, at
most ``max_delay_s`` from the first waiting request's arrival: an upper bound, never a floor. A batch
is padded to its longest window (not to ``max_seq_len``) and run in a worker thread, so the event
loop keeps accepting requests while the model runs (onnxruntime and torch release the GIL).

What is admitted and which windows form the next batch (fair queueing, aging, deadlines of large
requests, the padding cap, the queue bound) is decided by :class:`server.answering.scheduling.Scheduler`; this
module only moves the work: futures, the collector and watchdog tasks, the backend call. Windows of a
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
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np

from qa_core.squad import Feature, pad_batch
from server.answering.scheduling import DeadlineUnreachable, Request, Scheduler
from server.answering.scheduling import (
    QueueFull as QueueFull,  # raised by the policy; callers catch it from here
)

logger = logging.getLogger(__name__)

RunFn = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


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
    request: Request[_Job] | None = None  # whose ring entry holds its queued windows
    on_running: Callable[[], None] | None = None  # host work for the loop once its first window runs

    @property
    def dead(self) -> bool:
        """Failed, cancelled (client gone, timeout) or done: its remaining windows are skipped."""
        return self.future.done()


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
        self.policy: Scheduler[_Job] = Scheduler(
            max_batch_size, max_delay_s, max_queue, lookahead, max_padding, aging_s
        )
        self.pad_multiple_of = pad_multiple_of
        self.min_length = min_length  # e.g. a TensorRT profile's shortest sequence
        self.max_length = max_length  # pad_multiple_of never rounds past it (the model's max_seq_len)
        self.watchdog_factor = watchdog_factor
        self.watchdog_min_s = watchdog_min_s
        self._on_batch = on_batch
        self._on_queue_depth = on_queue_depth
        self._on_dropped = on_dropped
        self._on_hang = on_hang
        self._wakeup = asyncio.Event()
        self.workers = workers
        self._slots = asyncio.Semaphore(workers)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="inference")
        self._running: set[asyncio.Task] = set()
        self._calls: set[_Call] = set()
        self._dispatched = 0  # batches handed to _dispatch and not finished (the engine is idle at 0)
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
        return self.policy.waiting

    def check_admission(self, windows: int = 1) -> None:
        """Raise BatcherClosed, BatcherUnhealthy or QueueFull if ``windows`` more could not be queued now
        (the pipeline asks with 1 before tokenizing, so a full queue costs a request no work)."""
        if self._closed:
            raise BatcherClosed("the server is shutting down")
        if not self.healthy:
            raise BatcherUnhealthy("the inference backend is unhealthy")
        self.policy.check_queue(windows)

    def submit_many(
        self,
        groups: Sequence[Sequence[Feature]],
        tag: str = "",
        deadline: float | None = None,
        caller: str = "",
        on_running: Callable[[], None] | None = None,
    ) -> list[asyncio.Future]:
        """Admit one request's questions at once, all or none (a batch request is never half-queued).

        ``deadline`` (``time.perf_counter()`` time) lets a large request be scheduled to meet it;
        ``caller`` (an API key's name) is the lane it waits in: callers take turns. ``on_running`` is
        queued for the loop by the inference thread as a backend call holding one of its windows
        starts (each question's once: make it idempotent for a request of several), so the host's own
        work for the request runs beside the engine's instead of after it. Returns
        one future per question resolving to a :class:`JobResult`. Raises QueueFull, BatcherClosed or
        BatcherUnhealthy without queueing anything.
        """
        if any(not features for features in groups):
            raise ValueError("a question needs at least one window")
        n = sum(len(features) for features in groups)
        self.check_admission(n)
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        request: Request[_Job] = Request(deque(), now, deadline, caller=caller)
        futures = []
        for features in groups:
            k = len(features)
            job = _Job(
                features, loop.create_future(), now, [None] * k, k, k, tag=tag, request=request,
                on_running=on_running,
            )  # fmt: skip
            job.future.add_done_callback(
                cast("Callable[[asyncio.Future], None]", lambda _, job=job: self._forget(job))
            )
            request.windows.extend((job, i) for i in range(k))
            futures.append(job.future)
        self.policy.admit(request, now)  # may raise QueueFull: nothing is queued yet
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
            self._on_queue_depth(self.policy.waiting)

    def _forget(self, job: _Job) -> None:
        """A question died (cancelled, timed out, failed): its queued windows leave the queue at once."""
        dropped = self.policy.forget(job)
        if dropped:
            if self._on_dropped is not None:
                self._on_dropped(dropped)
            self._depth_changed()

    # ---- collector ------------------------------------------------------------------------------

    async def _collect(self) -> None:
        while True:
            if not self.policy.waiting:
                self.policy.clear_if_idle()  # only windows of dead questions can be left
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
            self._dispatched += 1
            self._dispatch(batch)

    async def _wait_for_fill(self) -> None:
        """While another backend call is in flight, wait for a full batch, at most max_delay from the
        first waiting request's arrival; with the engine idle, never (its end wakes this wait too)."""
        deadline = self.policy.fill_deadline()
        if deadline is None:
            return
        while self._dispatched and not self.policy.full and not self._closed:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), left)

    async def _form_batch(self) -> list[tuple[_Job, int]]:
        """The policy's next batch, at once when the engine is idle; the questions of large requests
        that can no longer meet their deadlines fail here."""
        await self._wait_for_fill()
        batch = self.policy.next_batch(time.perf_counter())
        for job in batch.unreachable:
            self._fail_job(
                job, DeadlineUnreachable("this question could not be answered within its deadline")
            )
        now = time.perf_counter()
        for job, _ in batch.windows:
            if job.first_start is None:
                job.first_start = now
        self._depth_changed()
        return batch.windows

    def _dispatch(self, chosen: list[tuple[_Job, int]]) -> None:
        """Hand ``chosen`` to the inference thread now, in the collector's own step, and leave a task to
        deliver the outputs. The engine never waits for another turn of the loop: answers waiting to be
        decoded (their futures were resolved first, so their steps come first) would run before a new
        task's first step, and the engine would idle through every decode (at 16 clients on the shipped
        model, a fifth of its throughput)."""
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        batch: dict[str, np.ndarray] | None = None
        call: _Call | None = None
        running: asyncio.Future | None = None
        try:
            features = [job.features[i] for job, i in chosen]
            pad_to = max(self.min_length, max(len(f) for f in features)) if self.min_length else None
            batch = pad_batch(
                features, pad_to=pad_to, multiple_of=self.pad_multiple_of, max_length=self.max_length
            )
            inputs = {k: batch[k] for k in MODEL_INPUTS}
            limit = self.policy.hang_limit(
                int(inputs["input_ids"].size), self.watchdog_factor, self.watchdog_min_s
            )
            call = _Call(chosen, start, limit)
            self._calls.add(call)
            running = loop.run_in_executor(
                self._executor, self._run_with_host_work, inputs, loop, _host_work(chosen)
            )
        except Exception as exc:  # noqa: BLE001 - reported by the task, as a failed call is
            failure: Exception | None = exc
        except BaseException:  # KeyboardInterrupt, SystemExit: nothing was started, give it all back
            self._call_over(call)
            raise
        else:
            failure = None
        task = loop.create_task(self._finish_call(chosen, start, batch, call, running, failure))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _finish_call(
        self,
        chosen: list[tuple[_Job, int]],
        start: float,
        batch: dict[str, np.ndarray] | None,
        call: _Call | None,
        running: asyncio.Future | None,
        failure: Exception | None,
    ) -> None:
        """Wait for the backend call :meth:`_dispatch` started (or report why it could not start), free
        its slot, and deliver each window its outputs."""
        try:
            if failure is not None:
                raise failure
            assert running is not None and call is not None and batch is not None
            outputs = await running
        except Exception:  # noqa: BLE001 - any backend failure fails this batch only
            tags = sorted({job.tag for job, _ in chosen})
            logger.exception("backend call failed for a batch of %d windows (requests %s)", len(chosen), tags)
            self._fail(chosen, InferenceError("the inference backend failed on this request's batch"))
            self._stats(batch, len(chosen), time.perf_counter() - start, failed=True)
            return
        finally:
            self._call_over(call)
        try:
            self._deliver(chosen, call, batch, outputs, start)
        except Exception:  # noqa: BLE001 - outputs of an unexpected shape: fail the batch, never leave it
            logger.exception("backend outputs of a batch of %d windows could not be read", len(chosen))
            self._fail(chosen, InferenceError("the inference backend returned unreadable outputs"))

    def _call_over(self, call: _Call | None) -> None:
        """A dispatched call ended (or never started): its slot is free and the collector may go on."""
        if call is not None:
            self._calls.discard(call)
        self._dispatched -= 1
        self._slots.release()
        self._wakeup.set()

    def _run_with_host_work(
        self,
        inputs: Mapping[str, np.ndarray],
        loop: asyncio.AbstractEventLoop,
        host_work: Callable[[], None] | None,
    ) -> dict[str, np.ndarray]:
        """In the inference thread: queue for the loop the host work its questions asked for
        (``on_running``), then run the backend. The loop runs it while this thread lets go of the GIL,
        which a backend does for its compute (onnxruntime, torch, TensorRT): then it overlaps the
        engine's. (Should the loop take the GIL first, the backend's Python prologue waits for it.)"""
        if host_work is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for the answers
                loop.call_soon_threadsafe(host_work)
        return self._run(inputs)

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
            self.policy.learn_speed(end - start, int(batch["input_ids"].size))
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
        for job in list(self.policy.queued_questions()):
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


def _host_work(chosen: list[tuple[_Job, int]]) -> Callable[[], None] | None:
    """The host work the call's questions asked for while the engine runs (``on_running``), each
    question's once, as one callable for the loop (None: none asked); it skips a question dead by
    then, and a hook that raises is logged and never fails the call."""
    hooks = []
    for job, _ in chosen:
        if job.on_running is not None:
            hooks.append((job, job.on_running))
            job.on_running = None
    if not hooks:
        return None

    def run_hooks() -> None:
        for job, hook in hooks:
            if job.dead:
                continue
            try:
                hook()
            except Exception:  # noqa: BLE001 - the engine's call goes on; the hook's work is optional
                logger.exception("host work to overlap with the engine failed (request %s)", job.tag)

    return run_hooks


def _finite_rows(outputs: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """Per batch row: are all of its floating-point outputs finite? A row of float32 or float16 values
    is summed in float64, which no finite row of them can overflow (it would take 10^269 values of
    3.4e38), so the sum is finite exactly when every value is: one reduction per output instead of a
    mask and a test of it (a check every answer waits for). float64 outputs are tested value by value."""
    ok: np.ndarray | None = None
    for value in outputs.values():
        if value.dtype.kind != "f":
            continue
        flat = value.reshape(rows, -1)
        if value.dtype.itemsize < 8:
            finite = np.isfinite(flat.sum(axis=1, dtype=np.float64))
        else:
            finite = np.isfinite(flat).all(axis=1)
        ok = finite if ok is None else ok & finite
    return np.ones(rows, dtype=bool) if ok is None else ok
