"""Slow clients: a connection must send a request's headers within ``header_timeout_s`` (counted from
the connection's start, and again after each response), else it is closed. uvicorn has a keep-alive
timeout for idle connections but none for a request whose headers trickle in a byte at a time
(slowloris), which would otherwise hold a connection, and a slot of ``max_connections``, forever.
The body has its own deadline (``body_timeout_s``, in :class:`server.errors.BodyLimitMiddleware`).
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("server")


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's headers."""

    header_timeout_s: float = 10.0  # set from the settings by ``python -m server`` and each worker's app

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:  # still waiting for a request's headers
            logger.warning("closing a connection whose request headers took over %g s", self.header_timeout_s)
            self.transport.close()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request's headers arrived
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this connection gets its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)
