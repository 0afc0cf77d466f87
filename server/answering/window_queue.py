"""Where a request's windows go to be run: the micro-batcher in this process, or the engine process
that serves every front of a host (:class:`server.topology.engine.client.EngineClient`). Either way the caller's
window limits are charged at the same moment, by the side that owns them, so a host has one set of
per-key limits however many processes answer HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from qa_core.squad import Feature
from server.answering.batching import MicroBatcher
from server.limits.quotas import CallerQuotas


class WindowQueue(Protocol):
    """What :class:`server.answering.request_path.AnswerService` needs of an engine."""

    def check_admission(self, windows: int = 1) -> None:
        """Raise (BatcherClosed, BatcherUnhealthy, QueueFull, ...) if ``windows`` could not be queued now:
        the cheap check before any tokenizing."""

    async def submit(
        self,
        groups: Sequence[Sequence[Feature]],
        *,
        tag: str,
        deadline: float,
        caller: str,
        on_running: Callable[[], None] | None = None,
    ) -> list[asyncio.Future]:
        """Queue one request's questions, all or none, charging ``caller`` their windows (OverLimit:
        nothing queued); one future per question resolving to a ``JobResult``. ``deadline`` is
        ``time.perf_counter()`` time. Cancelling the futures drops their windows still queued.
        ``on_running`` is host work to run on the event loop beside the engine's: called once the
        request's windows are on their way to the engine (queued by the inference thread as a call
        holding them starts, or at once when they were sent to an engine process)."""
        ...

    def charge(self, caller: str, windows: int) -> None:
        """Charge ``caller`` work that no queued window paid for (tokenizing a request then refused)."""


class LocalQueue:
    """The in-process micro-batcher and this process's per-key limits (a single-process server)."""

    def __init__(self, batcher: MicroBatcher, quotas: CallerQuotas) -> None:
        self.batcher, self.quotas = batcher, quotas

    def check_admission(self, windows: int = 1) -> None:
        self.batcher.check_admission(windows)

    async def submit(
        self,
        groups: Sequence[Sequence[Feature]],
        *,
        tag: str,
        deadline: float,
        caller: str,
        on_running: Callable[[], None] | None = None,
    ) -> list[asyncio.Future]:
        windows = sum(len(g) for g in groups)
        await self.quotas.acquire(caller, windows)
        try:
            futures = self.batcher.submit_many(
                groups, tag=tag, deadline=deadline, caller=caller, on_running=on_running
            )
        except BaseException:
            self.quotas.release_windows(caller, windows)
            raise
        release_when_done(futures, lambda: self.quotas.release_windows(caller, windows))
        return futures

    def charge(self, caller: str, windows: int) -> None:
        self.quotas.charge_work(caller, windows)


def release_when_done(futures: Sequence[asyncio.Future], release) -> None:
    """Call ``release()`` once every future is done (answered, failed or cancelled)."""
    left = len(futures)

    def one_done(_: asyncio.Future) -> None:
        nonlocal left
        left -= 1
        if left == 0:
            release()

    for f in futures:
        f.add_done_callback(one_done)
