"""Dynamic micro-batching: windows of concurrent questions share one backend call.

A question is submitted as all of its windows (features). A collector task in the event loop takes
the oldest waiting window, waits at most ``max_delay_s`` for the batch to fill up to ``max_batch_size``
windows, pads the batch to its longest window (not to ``max_seq_len``) and runs the backend in a
worker thread, so the event loop keeps accepting requests while the model runs (onnxruntime and
torch release the GIL). While a batch runs, new windows queue up and form the next batch ("batch
while busy"), which is where the throughput gain comes from.

Bucketing: the oldest waiting window always goes into the next batch (nothing starves), and the rest
of the batch is the waiting windows closest to it in length among the next ``lookahead`` ones, so short
questions are not padded to a long context's windows. A window joins only while the batch's padding
stays within ``max_padding`` of its real tokens: on a compute-bound CPU a batch costs about what its
windows cost one by one, so padding is pure loss; a window that would exceed the cap waits for the next
call. (Measured on 2 cores: a single client's questions, whose short last window used to be padded to
the full first one, were ~30% slower batched than unbatched; with the cap ~15%, the batching delay.) ``max_batch_size=1`` switches batching off;
``max_delay_s=0`` only stops waiting (windows already queued are still grouped).

Admission is bounded (``max_queue`` questions waiting): beyond it :class:`QueueFull` is raised
immediately (the HTTP layer answers 503 + Retry-After) instead of letting latency grow without bound.
A backend exception fails the questions of that batch only. ``drain()`` finishes everything already
admitted (graceful shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from train.squad import Feature, pad_batch

logger = logging.getLogger(__name__)

RunFn = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class QueueFull(RuntimeError):
    """Too many questions are waiting; retry later."""


class BatcherClosed(RuntimeError):
    """The server is shutting down and accepts no new work."""


class InferenceError(RuntimeError):
    """The backend call that held this question's windows raised."""


@dataclass
class BatchStats:
    """What one backend call looked like (for metrics)."""

    size: int
    padded_length: int
    padding_ratio: float
    seconds: float
    failed: bool = False


@dataclass(eq=False)
class _Job:
    """One question: its windows, their output rows as they arrive, and timing."""

    features: Sequence[Feature]
    future: asyncio.Future
    enqueued: float
    rows: list[dict[str, np.ndarray] | None]
    undispatched: int  # windows still in the queue
    remaining: int  # windows without outputs yet
    first_start: float | None = None

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


class MicroBatcher:
    """Groups windows of concurrent questions into backend calls; see the module docstring."""

    def __init__(
        self,
        run: RunFn,
        max_batch_size: int = 8,
        max_delay_s: float = 0.002,
        max_queue: int = 256,
        workers: int = 1,
        pad_multiple_of: int | None = None,
        min_length: int | None = None,
        lookahead: int | None = None,
        max_padding: float = 0.25,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_queue_depth: Callable[[int], None] | None = None,
    ) -> None:
        self._run = run
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self.pad_multiple_of = pad_multiple_of
        self.min_length = min_length  # e.g. a TensorRT profile's shortest sequence
        self.lookahead = lookahead if lookahead is not None else 4 * max_batch_size
        self.max_padding = max_padding  # padded tokens / real tokens - 1, at most
        self._on_batch = on_batch
        self._on_queue_depth = on_queue_depth
        self._pending: deque[tuple[_Job, int]] = deque()  # (job, window index)
        self._queued_jobs = 0  # admitted questions not yet fully dispatched
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(workers)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="inference")
        self._running: set[asyncio.Task] = set()
        self._closed = False
        self._collector: asyncio.Task | None = None

    # ---- public API ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the collector task (inside a running event loop)."""
        if self._collector is None:
            self._collector = asyncio.get_running_loop().create_task(self._collect(), name="micro-batcher")
            self._collector.add_done_callback(self._collector_done)

    def _collector_done(self, task: asyncio.Task) -> None:
        """If the collector ever dies, fail what is queued rather than leave requests hanging."""
        if task.cancelled() or task.exception() is None:
            return
        logger.error("micro-batcher collector crashed", exc_info=task.exception())
        self._closed = True
        self._fail(list(self._pending), InferenceError(f"batcher crashed: {task.exception()!r}"))

    @property
    def queued(self) -> int:
        """Questions admitted whose windows are not all dispatched yet."""
        return self._queued_jobs

    def submit_many(self, groups: Sequence[Sequence[Feature]]) -> list[asyncio.Future]:
        """Admit several questions at once, all or none (a batch request is never half-queued).

        Returns one future per question resolving to a :class:`JobResult`. Raises QueueFull or
        BatcherClosed without queueing anything.
        """
        if self._closed:
            raise BatcherClosed("the server is shutting down")
        if self._queued_jobs + len(groups) > self.max_queue:
            raise QueueFull(f"{self._queued_jobs} questions are waiting (limit {self.max_queue})")
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        futures = []
        for features in groups:
            if not features:
                raise ValueError("a question needs at least one window")
            n = len(features)
            job = _Job(features, loop.create_future(), now, [None] * n, undispatched=n, remaining=n)
            self._pending.extend((job, i) for i in range(len(features)))
            self._queued_jobs += 1
            futures.append(job.future)
        self._depth_changed()
        self._wakeup.set()
        return futures

    async def submit(self, features: Sequence[Feature]) -> JobResult:
        """Queue one question's windows and wait for all of their outputs."""
        future = self.submit_many([features])[0]
        return await future

    async def drain(self, timeout: float | None = None) -> None:
        """Refuse new work, finish all admitted work, stop the collector and the threads."""
        self._closed = True
        self._wakeup.set()
        if self._collector is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._collector), timeout)
            self._collector.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- collector ------------------------------------------------------------------------------

    def _depth_changed(self) -> None:
        if self._on_queue_depth is not None:
            self._on_queue_depth(len(self._pending))

    async def _collect(self) -> None:
        while True:
            self._purge_dead()
            if not self._pending:
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
            if not batch:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _purge_dead(self) -> None:
        """Forget queued windows of questions that already failed or were cancelled."""
        if any(job.dead for job, _ in self._pending):
            alive: deque[tuple[_Job, int]] = deque()
            for item in self._pending:
                if item[0].dead:
                    self._leave_queue(item[0])
                else:
                    alive.append(item)
            self._pending = alive
            self._depth_changed()

    def _leave_queue(self, job: _Job) -> None:
        """One window of ``job`` left the queue; the question stops counting once all of them have."""
        job.undispatched -= 1
        if job.undispatched == 0:
            self._queued_jobs -= 1

    async def _form_batch(self) -> list[tuple[_Job, int]]:
        """Wait up to max_delay for max_batch_size windows, then pick them (oldest first, then closest lengths)."""
        if self.max_batch_size > 1 and self.max_delay_s > 0 and len(self._pending) < self.max_batch_size:
            # The delay counts from the oldest window's arrival: one that already waited (behind a running
            # batch, or left out of the last one by the padding cap) does not wait again.
            deadline = self._pending[0][0].enqueued + self.max_delay_s
            while len(self._pending) < self.max_batch_size and not self._closed:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._wakeup.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), left)
        self._purge_dead()
        if not self._pending:
            return []
        head = self._pending.popleft()
        chosen = [head]
        if self.max_batch_size > 1 and self._pending:
            window = min(len(self._pending), self.lookahead)
            target = len(head[0].features[head[1]])
            lengths = [len(job.features[i]) for job, i in itertools.islice(self._pending, window)]
            closest = sorted(range(window), key=lambda k: (abs(lengths[k] - target), k))
            picked = self._within_padding(target, [(k, lengths[k]) for k in closest])
            chosen += [self._pending[k] for k in sorted(picked)]
            self._pending = deque(x for k, x in enumerate(self._pending) if k not in picked)
        now = time.perf_counter()
        for job, _ in chosen:
            if job.first_start is None:
                job.first_start = now
            self._leave_queue(job)
        self._depth_changed()
        return chosen

    def _within_padding(self, first: int, candidates: list[tuple[int, int]]) -> set[int]:
        """Of (index, length) candidates, closest length first, those that join a batch starting with a
        window of `first` tokens while it has room and its padding stays within max_padding."""
        picked: set[int] = set()
        longest, real = first, first
        for k, length in candidates:
            if len(picked) == self.max_batch_size - 1:
                break
            wider = max(longest, length)
            if wider * (len(picked) + 2) <= (1 + self.max_padding) * (real + length):
                picked.add(k)
                longest, real = wider, real + length
        return picked

    async def _execute(self, chosen: list[tuple[_Job, int]]) -> None:
        start = time.perf_counter()
        batch: dict[str, np.ndarray] | None = None
        try:
            features = [job.features[i] for job, i in chosen]
            pad_to = max(self.min_length, max(len(f) for f in features)) if self.min_length else None
            batch = pad_batch(features, pad_to=pad_to, multiple_of=self.pad_multiple_of)
            inputs = {k: batch[k] for k in MODEL_INPUTS}
            outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._run, inputs)
        except Exception as exc:  # noqa: BLE001 - any backend failure fails this batch only
            logger.exception("backend call failed for a batch of %d windows", len(chosen))
            self._fail(chosen, InferenceError(f"inference failed: {type(exc).__name__}: {exc}"))
            self._stats(batch, len(chosen), time.perf_counter() - start, failed=True)
            return
        finally:
            self._slots.release()
            self._wakeup.set()
        end = time.perf_counter()
        self._stats(batch, len(chosen), end - start)
        for row, (job, i) in enumerate(chosen):
            if job.dead:
                continue
            job.rows[i] = {name: value[row] for name, value in outputs.items()}
            job.remaining -= 1
            if job.remaining == 0:
                first = job.first_start if job.first_start is not None else end
                job.future.set_result(JobResult(job.rows, first - job.enqueued, end - first))  # type: ignore[arg-type]

    @staticmethod
    def _fail(chosen: list[tuple[_Job, int]], error: Exception) -> None:
        for job, _ in chosen:
            if not job.dead:
                job.future.set_exception(error)

    def _stats(
        self, batch: dict[str, np.ndarray] | None, size: int, seconds: float, failed: bool = False
    ) -> None:
        if self._on_batch is None or batch is None:
            return
        mask = batch["attention_mask"]
        ratio = 1.0 - float(mask.sum()) / float(mask.size) if mask.size else 0.0
        self._on_batch(BatchStats(size, int(mask.shape[1]), ratio, seconds, failed))
