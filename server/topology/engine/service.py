"""The engine's side of the wire: a ZeroMQ ROUTER socket over the micro-batcher and the host's per-key
limits. Every front's windows go into one queue, so a backend call groups windows of requests that
arrived at different fronts.

A request (``Submit``) is charged to its caller and queued all or nothing, then answered once with its
questions' output rows (``Done``) or why it failed (``Failed``), never both; a ``Cancel`` drops its
windows still queued and it is not answered. A front that has sent nothing for ``FRONT_SILENCE_S``
(it pings several times a second) is gone: its requests are cancelled, so a killed front costs the
engine only the windows already in a backend call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from server.answering.batching import JobResult
from server.answering.lifecycle import ModelLifecycle
from server.answering.window_queue import LocalQueue, release_when_done
from server.limits.quotas import CallerQuotas, OverLimit
from server.topology.engine import wire
from server.topology.engine.client import sent_now
from server.topology.engine.failures import kind_of

logger = logging.getLogger("server.topology.engine")
FRONT_SILENCE_S = 3.0
SWEEP_S = 1.0


class EngineWindow:
    """A window as the batcher reads it (``pad_batch``): ids, an all-ones mask and segment ids."""

    __slots__ = ("attention_mask", "input_ids", "p_mask", "token_type_ids")

    def __init__(self, window: wire.Window) -> None:
        self.input_ids = np.frombuffer(window.input_ids, dtype="<i4").astype(np.int64)
        self.token_type_ids = np.frombuffer(window.token_type_ids, dtype="<i4").astype(np.int64)
        if self.input_ids.shape != self.token_type_ids.shape or not len(self.input_ids):
            raise ValueError("a window needs as many segment ids as token ids, and at least one")
        self.attention_mask = np.ones_like(self.input_ids)
        self.p_mask = np.zeros_like(self.input_ids)  # decoding happens at the front

    def __len__(self) -> int:
        return len(self.input_ids)


class EngineService:
    """Serves fronts on ``address`` with ``runtime``'s batcher (a ``ModelLifecycle(answers=False)``)."""

    def __init__(self, runtime: ModelLifecycle, quotas: CallerQuotas, address: str) -> None:
        self.runtime, self.quotas, self.address = runtime, quotas, address
        self.incarnation = uuid.uuid4().hex
        self.jobs: dict[tuple[bytes, int], list[asyncio.Future]] = {}
        self.seen: dict[bytes, float] = {}  # front identity -> when it last sent anything
        self._tasks: set[asyncio.Task] = set()  # requests' limits being checked (a shared store may wait)
        self._context = zmq.asyncio.Context()
        self.socket = self._context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 1000)  # replies still queued at shutdown get a second to leave

    async def serve(self) -> None:
        """Bind and answer until cancelled. No message can end this loop: one whose handling fails is
        logged (and its request failed), and the next is read."""
        self.socket.bind(self.address)
        sweeper = asyncio.create_task(self._sweep())
        try:
            while True:
                identity, payload = await self._receive()
                if identity is not None:
                    self._handle_safely(identity, payload)
        finally:
            sweeper.cancel()

    def _handle_safely(self, identity: bytes, payload: bytes) -> None:
        try:
            self._handle(identity, payload)
        except Exception:  # noqa: BLE001 - one message must never stop the engine (nor read as a failed load)
            logger.exception("the engine could not handle a message (%d bytes); it goes on", len(payload))

    async def _receive(self) -> tuple[bytes | None, bytes]:
        frames = await self.socket.recv_multipart()
        if len(frames) != 2:
            return None, b""
        return frames[0], frames[1]

    def _handle(self, identity: bytes, payload: bytes) -> None:
        self.seen[identity] = time.monotonic()
        try:
            message = wire.to_engine.decode(payload)
        except msgspec.DecodeError:
            logger.warning("ignored a message the engine cannot read (%d bytes)", len(payload))
            return
        if isinstance(message, wire.Ping):
            self._send(identity, self._state(message.protocol))
        elif isinstance(message, wire.Admit):
            self._spawn(self._admit(identity, message), identity, message.id)
        elif isinstance(message, wire.Submit):
            self._submit(identity, message)
        elif isinstance(message, wire.Cancel):
            for future in self.jobs.pop((identity, message.id), []):
                future.cancel()
        elif isinstance(message, wire.Charge):
            self.quotas.charge_work(message.caller, message.windows)

    def _state(self, protocol: int) -> wire.State:
        batcher = self.runtime.batcher
        state = self.runtime.state if protocol == wire.PROTOCOL else "incompatible"
        ready = self.runtime.backend is not None
        return wire.State(
            state=state,
            incarnation=self.incarnation,
            queued=batcher.queued if batcher is not None else 0,
            max_queue=self.runtime.settings.max_queue,
            describe=self.runtime.describe() if ready else None,
            runs_on=self.runtime.runs_on() if ready else None,
        )

    def _spawn(self, work: Coroutine[Any, Any, None], identity: bytes, request: int) -> None:
        """Run ``work`` (a request's limits, which may wait on a shared store) beside the loop; if it
        fails unexpectedly, its request fails, and the engine goes on."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)

        def done(task: asyncio.Task) -> None:
            self._tasks.discard(task)
            if task.cancelled() or task.exception() is None:
                return
            logger.error("the engine failed a request while checking its limits", exc_info=task.exception())
            if self.jobs.get((identity, request)) == []:  # still the placeholder of a request not queued
                del self.jobs[(identity, request)]
            self._send(identity, wire.Failed(request, "internal", "the engine failed to check this request"))

        task.add_done_callback(done)

    async def _admit(self, identity: bytes, message: wire.Admit) -> None:
        try:
            await self.quotas.admit(message.caller)
        except OverLimit as exc:
            self._send(identity, _over_limit(message.id, exc))
            return
        self._send(identity, wire.Done(message.id))

    def _submit(self, identity: bytes, message: wire.Submit) -> None:
        runtime, batcher = self.runtime, self.runtime.batcher
        if not runtime.ready or batcher is None:
            kind = {"stopping": "closed", "unhealthy": "unhealthy"}.get(runtime.state, "engine_unavailable")
            self._send(identity, wire.Failed(message.id, kind, f"the inference engine is {runtime.state}"))
            return
        try:
            groups = [[EngineWindow(w) for w in question] for question in message.questions]
        except ValueError as exc:
            self._send(identity, wire.Failed(message.id, "internal", str(exc)))
            return
        deadline = time.perf_counter() + max(0.0, message.seconds_left)
        key = (identity, message.id)
        self.jobs[key] = []  # a Cancel arriving while its limits are checked finds it
        queue = LocalQueue(batcher, self.quotas)
        self._spawn(self._queue(queue, key, groups, message, deadline), identity, message.id)

    async def _queue(
        self,
        queue: LocalQueue,
        key: tuple[bytes, int],
        groups: list[list[EngineWindow]],
        message: wire.Submit,
        deadline: float,
    ) -> None:
        identity = key[0]
        try:  # charged and queued as in a single-process server, all or nothing
            futures = await queue.submit(
                groups,  # type: ignore[arg-type]
                tag=message.tag,
                deadline=deadline,
                caller=message.caller,
            )
        except OverLimit as exc:
            self._forget_job(key, identity, _over_limit(message.id, exc))
            return
        except Exception as exc:  # noqa: BLE001 - QueueFull, BatcherClosed, ... : nothing was queued
            self._forget_job(key, identity, wire.Failed(message.id, kind_of(exc), str(exc)))
            return
        if key not in self.jobs:  # cancelled (or its front went silent) while its limits were checked
            for future in futures:
                future.cancel()
            return
        self.jobs[key] = futures
        for future in futures:  # a question that fails ends its request: its siblings' windows leave
            future.add_done_callback(functools.partial(_cancel_siblings, futures))
        windows = sum(len(g) for g in groups)
        release_when_done(futures, functools.partial(self._answer, key, futures, windows))

    def _forget_job(self, key: tuple[bytes, int], identity: bytes, reply: wire.Failed) -> None:
        """A request refused before it was queued: answered, unless it was cancelled meanwhile."""
        if self.jobs.pop(key, None) is not None:
            self._send(identity, reply)

    def _answer(self, key: tuple[bytes, int], futures: Sequence[asyncio.Future], windows: int) -> None:
        """Every question of a request is done (its windows are given back by the queue): answer its
        front, unless the front cancelled it or it was cancelled because its front went silent."""
        if self.jobs.get(key) is not futures:
            return
        del self.jobs[key]
        identity, request = key
        failure = next(
            (f.exception() for f in futures if not f.cancelled() and f.exception() is not None), None
        )
        if failure is not None:
            self._send(identity, wire.Failed(request, kind_of(failure), str(failure)))
            return
        if any(f.cancelled() for f in futures):
            return
        results: list[JobResult] = [f.result() for f in futures]
        questions = [
            wire.QuestionResult([wire.rows_of(row) for row in r.rows], r.queue_s, r.inference_s)
            for r in results
        ]
        self._send(identity, wire.Done(request, questions, windows))

    def _send(self, identity: bytes, message: wire.State | wire.Done | wire.Failed) -> None:
        if not sent_now(self.socket.send_multipart([identity, wire.encode(message)], flags=zmq.NOBLOCK)):
            # the front is not reading (its queue is full): it fails the request itself when it notices
            logger.warning("a front is not reading its replies; one was dropped")

    async def _sweep(self) -> None:
        """Cancel the requests of fronts that have gone silent (killed, hung)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            gone = {identity for identity, seen in self.seen.items() if now - seen > FRONT_SILENCE_S}
            if not gone:
                continue
            for identity in gone:
                del self.seen[identity]
            dropped = [key for key in self.jobs if key[0] in gone]
            for key in dropped:
                for future in self.jobs.pop(key):
                    future.cancel()
            logger.warning(
                "%d front(s) silent for over %g s: their %d request(s) were cancelled",
                len(gone), FRONT_SILENCE_S, len(dropped),
            )  # fmt: skip

    async def close(self, timeout_s: float) -> None:
        """Let the answers of admitted requests go out (within ``timeout_s``), then close the socket;
        requests whose limits were still being checked are given up (their fronts fail them)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for key in [key for key, futures in self.jobs.items() if not futures]:
            del self.jobs[key]  # placeholders of requests never queued
        deadline = time.monotonic() + timeout_s
        while self.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.socket.close()
        self._context.term()


def _cancel_siblings(futures: Sequence[asyncio.Future], done: asyncio.Future) -> None:
    if not done.cancelled() and done.exception() is not None:
        for f in futures:
            f.cancel()


def _over_limit(request: int, exc: OverLimit) -> wire.Failed:
    return wire.Failed(
        request, "over_limit", exc.message, limit=exc.limit, retry_after=float(exc.retry_after)
    )
