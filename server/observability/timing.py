"""Where one request's time went, stage by stage, in a ``Server-Timing`` response header (W3C Server
Timing; browsers' developer tools show it, ``bench.serve`` reads it)::

    Server-Timing: auth;dur=0.004, parse;dur=0.061, featurize;dur=0.142, queue;dur=0.010,
                   engine;dur=4.871, decode;dur=0.093, serialize;dur=0.021, total;dur=5.310

Milliseconds. ``total`` runs from the request's arrival in the app (its headers parsed) to the start
of the response; the named stages lie within it, and what is left (the middleware, the event loop's
other work) is ``total`` minus their sum. ``parse`` is routing plus reading and validating the body;
for a batch request, ``featurize`` and ``decode`` are summed over its questions, ``queue`` and
``engine`` are the slowest question's. The header is on answers (``/answer``, ``/answer/batch``),
the only responses whose stages are worth reading.
"""

from __future__ import annotations

import time

from starlette.types import Message, Receive, Scope, Send

from server.door.http_middleware import HttpMiddleware

STAGES = ("auth", "parse", "featurize", "queue", "engine", "decode", "serialize")
HEADER = b"server-timing"
_CLOCK = "stage_clock"


class StageClock:
    """Milliseconds per stage of one request, and the moment the door let it in."""

    __slots__ = ("admitted", "ms", "start")

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.admitted: float | None = None  # when the door let the request through to the app
        self.ms: dict[str, float] = {}

    def add(self, stage: str, ms: float) -> None:
        self.ms[stage] = self.ms.get(stage, 0.0) + ms

    def since(self, stage: str, start: float) -> float:
        """Add the time since ``start`` (``perf_counter`` seconds) to ``stage``; returns now."""
        now = time.perf_counter()
        self.add(stage, (now - start) * 1000)
        return now

    def header(self) -> bytes:
        total = (time.perf_counter() - self.start) * 1000
        parts = [f"{name};dur={self.ms[name]:.3f}" for name in STAGES if name in self.ms]
        return ", ".join([*parts, f"total;dur={total:.3f}"]).encode("latin-1")


def stage_clock(scope: Scope) -> StageClock | None:
    """The clock of the request ``scope`` belongs to (None outside :class:`TimingMiddleware`)."""
    return (scope.get("state") or {}).get(_CLOCK)


class TimingMiddleware(HttpMiddleware):
    """Outermost: starts each request's clock; adds ``Server-Timing`` to responses that timed a stage
    the app reports (answers), so probes and errors before the app pay nothing more than the clock."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        clock = StageClock()
        scope.setdefault("state", {})[_CLOCK] = clock

        async def send_with_timing(message: Message) -> None:
            if message["type"] == "http.response.start" and "featurize" in clock.ms:
                message["headers"] = [*message.get("headers", ()), (HEADER, clock.header())]
            await send(message)

        await self.app(scope, receive, send_with_timing)
