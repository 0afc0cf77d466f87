"""Slow clients: a connection must send a request's headers within ``header_timeout_s`` (counted from
the moment the connection was accepted, TLS handshake included, and again after each response), else
it is closed. uvicorn has a keep-alive timeout for idle connections but none for a request whose
headers trickle in a byte at a time (slowloris), which would otherwise hold a connection, and a slot
of ``max_connections``, forever. The body has its own deadline (``body_timeout_s``, in
:class:`server.body_limit.BodyLimitMiddleware`).

With TLS, :func:`connection_protocol` wraps the HTTP protocol in :class:`server.tls.HandshakeProtocol`
at accept: the handshake gets the header deadline and the connection counts toward
``max_connections`` while it handshakes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from server.tls import HandshakeProtocol

logger = logging.getLogger("server")
MIN_DELAY_S = 0.01


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's headers."""

    # This process's connection rules, set by ``python -m server`` and by each worker's app factory.
    header_timeout_s: float = 10.0
    tls: ssl.SSLContext | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._accepted_at = self.loop.time()
        self._header_timer: asyncio.TimerHandle | None = None
        self._handshake: HandshakeProtocol | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn
        super().connection_made(transport)
        elapsed = self.loop.time() - self._accepted_at  # a TLS handshake already took this much
        self._arm_header_timer(max(MIN_DELAY_S, self.header_timeout_s - elapsed))

    def _arm_header_timer(self, delay_s: float) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(delay_s, self._headers_too_slow)

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
            self._arm_header_timer(self.header_timeout_s)  # the next request gets its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """On server shutdown: a connection still in its TLS handshake has no HTTP transport yet."""
        if self.transport is None:
            raw = self._handshake.raw_transport if self._handshake is not None else None
            if raw is not None:
                raw.close()
            return
        super().shutdown()


def connection_protocol(*args: Any, **kwargs: Any) -> asyncio.Protocol:
    """uvicorn's ``http`` protocol factory (its arguments as uvicorn passes them): the HTTP protocol,
    wrapped in TLS at accept when this process serves HTTPS."""
    http = HeaderDeadlineProtocol(*args, **kwargs)
    if HeaderDeadlineProtocol.tls is None:
        return http
    http.connections.add(http)  # counted from the accept, not from the end of the handshake
    http._handshake = HandshakeProtocol(
        http, HeaderDeadlineProtocol.tls, HeaderDeadlineProtocol.header_timeout_s,
        released=lambda: http.connections.discard(http),
    )  # fmt: skip
    return http._handshake


class _HttpsInStartLine(logging.Filter):
    """uvicorn's "running on http://..." line names the scheme of TLS it does itself; ours is https."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Uvicorn running on") and record.args:
            args = tuple(record.args) if isinstance(record.args, tuple) else (record.args,)
            record.args = ("https", *args[1:]) if args[0] == "http" else args
        return True


def configure_connections(header_timeout_s: float, tls: ssl.SSLContext | None) -> None:
    """This process's connection rules: the header deadline, and TLS (None: plain HTTP)."""
    HeaderDeadlineProtocol.header_timeout_s = header_timeout_s
    HeaderDeadlineProtocol.tls = tls
    if tls is not None:
        logging.getLogger("uvicorn.error").addFilter(_HttpsInStartLine())
