"""One worker thread that serves its callers in turn: the featurizing thread for long inputs.

A FIFO thread pool serves whoever sends the most: one tenant sending long contexts as fast as its
limits allow keeps the thread busy and every other tenant's long input waits behind all of them. Here
each caller (an API key's name) has its own queue and the thread takes one job from each caller in
turn, so a tenant with one job waits for at most one job of each other tenant, however many they sent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class FairExecutor:
    """``submit(caller, fn)`` runs ``fn()`` in the worker thread, callers served round-robin."""

    def __init__(self, name: str = "featurize") -> None:
        self._queues: OrderedDict[str, deque[tuple[Callable[[], Any], Future]]] = OrderedDict()
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, caller: str, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the executor is shut down")
            self._queues.setdefault(caller, deque()).append((fn, future))
            self._lock.notify()
        return future

    def waiting(self, caller: str | None = None) -> int:
        """Jobs not started yet (of ``caller``, or of everyone)."""
        with self._lock:
            if caller is not None:
                return len(self._queues.get(caller, ()))
            return sum(len(q) for q in self._queues.values())

    def _next(self) -> tuple[Callable[[], Any], Future] | None:
        with self._lock:
            while not self._queues and not self._closed:
                self._lock.wait()
            if not self._queues:
                return None
            caller, queue = next(iter(self._queues.items()))
            job = queue.popleft()
            del self._queues[caller]  # to the back of the round: the next caller goes first
            if queue:
                self._queues[caller] = queue
            return job

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Stop taking jobs; those not started are cancelled."""
        with self._lock:
            self._closed = True
            queues, self._queues = self._queues, OrderedDict()
            self._lock.notify_all()
        for queue in queues.values():
            for _, future in queue:
                future.cancel()
