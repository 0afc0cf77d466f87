"""A front's side of the wire: the ``WindowQueue`` and ``DoorLimits`` a front's app uses, backed by
the engine process.

The client pings the engine every ``PING_S`` and knows its state from the answers. The engine is
*unavailable* when its socket disconnects (the process died: ZeroMQ's monitor says so at once), when it
has not answered for ``SILENCE_S`` (hung), or when it comes back as a new incarnation (restarted): in
each case every request still waiting fails at once with :class:`EngineUnavailable` (503 +
Retry-After), none waits for an answer that cannot come. Nothing is sent while the engine is
unavailable (``ZMQ_IMMEDIATE``: no message queues up for an engine that is not there), so a request
is never delivered twice or to an engine that did not admit it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from qa_core.squad import Feature
from server.answering.batching import JobResult, QueueFull
from server.limits.quotas import OverLimit
from server.topology.engine import wire
from server.topology.engine.failures import EngineUnavailable, exception_of

logger = logging.getLogger("server.topology.engine")
PING_S = 0.2
SILENCE_S = 1.5
ADMIT_TIMEOUT_S = 5.0


class EngineClient:
    """Talks to the engine at ``address`` (``ipc://...``); ``limits_active=False`` skips the door's
    round trip when no per-key limit is configured."""

    def __init__(self, address: str, *, limits_active: bool = True) -> None:
        self.address, self.limits_active = address, limits_active
        self.engine_state = "connecting"
        self.incarnation: str | None = None
        self.queued = 0
        self.max_queue = 1
        self.facts: dict[str, Any] = {}  # the backend's describe(), from the engine
        self.runs_on: dict[str, Any] = {}
        self.restarts_seen = 0
        self._last_heard = 0.0
        self._connected = False
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[list[asyncio.Future], str]] = {}  # submitted requests
        self._admits: dict[int, tuple[list[asyncio.Future], str]] = {}  # the door's questions
        self._saturated: dict[str, float] = {}  # key -> until when it is refused at the door (in flight)
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._tasks: list[asyncio.Task] = []
        self.state_changed = asyncio.Event()

    # ---- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        monitor = self._socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._socket.connect(self.address)
        self._tasks = [
            asyncio.create_task(self._receive(), name="engine-receive"),
            asyncio.create_task(self._ping(), name="engine-ping"),
            asyncio.create_task(self._watch(monitor), name="engine-monitor"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.fail_all(EngineUnavailable("the server is shutting down"))
        self._socket.close()
        self._context.term()

    @property
    def available(self) -> bool:
        return self._connected and time.monotonic() - self._last_heard < SILENCE_S

    @property
    def ready(self) -> bool:
        return self.available and self.engine_state == "ready"

    @property
    def state(self) -> str:
        """The engine's state as this front sees it (``unavailable`` when it cannot be reached)."""
        return self.engine_state if self.available else "unavailable"

    # ---- WindowQueue ------------------------------------------------------------------------------

    def check_admission(self, windows: int = 1) -> None:
        if not self.ready:
            raise EngineUnavailable(f"the inference engine is {self.state}; retry shortly")
        if self.queued + windows > self.max_queue:
            raise QueueFull(f"about {self.queued} windows are waiting (limit {self.max_queue})")

    async def submit(
        self,
        groups: Sequence[Sequence[Feature]],
        *,
        tag: str,
        deadline: float,
        caller: str,
        on_running: Callable[[], None] | None = None,
    ) -> list[asyncio.Future]:
        self.check_admission(0)
        loop = asyncio.get_running_loop()
        request = next(self._ids)
        message = wire.Submit(
            request,
            caller,
            tag,
            deadline - time.perf_counter(),
            [[wire.window_of(f.input_ids, f.token_type_ids) for f in windows] for windows in groups],
        )
        self._send(message)
        futures = [loop.create_future() for _ in groups]
        self._pending[request] = (futures, caller)
        for f in futures:
            f.add_done_callback(functools.partial(self._maybe_cancel, request))
        if on_running is not None:  # sent: the engine process queues or runs the windows from now on
            try:
                on_running()
            except Exception:  # noqa: BLE001 - the request is sent: its answer must still reach the caller
                logger.exception("host work to overlap with the engine failed (request %s)", tag)
        return futures

    def charge(self, caller: str, windows: int) -> None:
        if self.limits_active and self.available:
            with contextlib.suppress(EngineUnavailable):
                self._send(wire.Charge(caller, windows))

    def _maybe_cancel(self, request: int, future: asyncio.Future) -> None:
        """A question of ``request`` was cancelled (client gone, timeout, a sibling failed): tell the
        engine to drop its windows."""
        if future.cancelled() and self._pending.pop(request, None) is not None and self.available:
            with contextlib.suppress(EngineUnavailable):
                self._send(wire.Cancel(request))

    # ---- DoorLimits -------------------------------------------------------------------------------

    async def admit(self, name: str) -> None:
        saturated_until = self._saturated.get(name)
        if saturated_until is not None:
            if time.monotonic() < saturated_until:
                raise OverLimit(
                    name, "inflight_windows", saturated_until - time.monotonic(),
                    "this key's last request was refused at its limit of windows in flight: retry once some "
                    "are answered",
                )  # fmt: skip
            del self._saturated[name]
        if not self.limits_active:
            return
        if not self.available:
            raise EngineUnavailable(f"the inference engine is {self.state}; retry shortly")
        request = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._admits[request] = ([future], name)
        try:
            self._send(wire.Admit(request, name))
            await asyncio.wait_for(future, ADMIT_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise EngineUnavailable("the inference engine did not answer in time") from None
        finally:
            self._admits.pop(request, None)

    # ---- the socket -------------------------------------------------------------------------------

    def _send(self, message: wire.Ping | wire.Admit | wire.Submit | wire.Cancel | wire.Charge) -> None:
        """Send now or raise EngineUnavailable (nothing waits for a connection that is not there)."""
        if not sent_now(self._socket.send(wire.encode(message), flags=zmq.NOBLOCK)):
            raise EngineUnavailable("the inference engine is not connected; retry shortly")

    async def _receive(self) -> None:
        while True:
            payload = await self._socket.recv()
            try:
                message = wire.from_engine.decode(payload)
            except Exception:  # noqa: BLE001 - a message this front cannot read is dropped, not fatal
                logger.warning("ignored an engine message this front cannot read (%d bytes)", len(payload))
                continue
            self._last_heard = time.monotonic()
            if isinstance(message, wire.State):
                self._on_state(message)
            elif isinstance(message, wire.Done):
                self._on_done(message)
            else:
                self._on_failed(message)

    def _on_state(self, state: wire.State) -> None:
        if self.incarnation is not None and state.incarnation != self.incarnation:
            self.restarts_seen += 1
            logger.warning("the inference engine restarted; requests it held were failed")
            self.fail_all(EngineUnavailable("the inference engine restarted; retry"))
        changed = (state.state, state.incarnation) != (self.engine_state, self.incarnation)
        self.incarnation, self.engine_state = state.incarnation, state.state
        self.queued, self.max_queue = state.queued, state.max_queue
        if state.describe is not None:
            self.facts, self.runs_on = state.describe, state.runs_on or {}
        if changed:
            self.state_changed.set()

    def _on_done(self, done: wire.Done) -> None:
        if done.id in self._admits:
            _resolve(self._admits[done.id][0][0], None)
            return
        futures, _ = self._pending.pop(done.id, ([], ""))
        for future, question in zip(futures, done.questions, strict=False):
            rows = [{name: a.array() for name, a in row.items()} for row in question.rows]
            _resolve(future, JobResult(rows, question.queue_s, question.inference_s))

    def _on_failed(self, failed: wire.Failed) -> None:
        admission = failed.id in self._admits
        futures, caller = self._admits.get(failed.id) or self._pending.pop(failed.id, ([], ""))
        error = exception_of(failed.kind, failed.message, failed.limit, failed.retry_after, caller)
        if admission and not isinstance(error, OverLimit):  # the engine could not check the door's limits
            error = EngineUnavailable("the inference engine could not check this key's limits; retry")
        if isinstance(error, OverLimit) and error.limit == "inflight_windows":
            # at its cap in the engine: this front refuses the key at the door for the Retry-After it
            # was told, instead of reading and tokenizing requests the engine would refuse again
            self._saturated[caller] = time.monotonic() + error.retry_after
        for future in futures:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a sibling's failure already ended the request

    async def _ping(self) -> None:
        was_available = False
        while True:
            if self._connected:
                with contextlib.suppress(EngineUnavailable):
                    self._send(wire.Ping())
            await asyncio.sleep(PING_S)
            if was_available and not self.available:
                logger.warning("the inference engine stopped answering (%s)", self.state)
                self.fail_all(EngineUnavailable("the inference engine stopped answering; retry"))
                self.state_changed.set()
            was_available = self.available

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())["event"]
                if event == zmq.EVENT_CONNECTED:
                    self._connected = True
                    with contextlib.suppress(EngineUnavailable):
                        self._send(wire.Ping())
                elif event == zmq.EVENT_DISCONNECTED:
                    self._connected = False
                    self.fail_all(EngineUnavailable("the inference engine went away; retry"))
                    self.state_changed.set()
        finally:
            monitor.close()

    def fail_all(self, error: Exception) -> None:
        """Fail every request and admission still waiting for the engine with ``error``."""
        pending, self._pending = self._pending, {}
        for futures, _ in [*pending.values(), *self._admits.values()]:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
                    future.exception()


def sent_now(send: Awaitable[Any]) -> bool:
    """Whether a non-blocking send of zmq.asyncio (a future, done at once) went out; False when the
    peer's queue is full or there is no peer (``zmq.Again``); any other error is raised."""
    sending = cast(asyncio.Future, send)
    if not sending.done():  # not expected with NOBLOCK; its outcome is read when it comes
        sending.add_done_callback(lambda f: f.exception())
        return True
    error = sending.exception()
    if error is None:
        return True
    if isinstance(error, zmq.Again):
        return False
    raise error


def _resolve(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)
