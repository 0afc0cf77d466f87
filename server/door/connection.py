"""One HTTP/1.1 connection's rules, enforced while its bytes are parsed (httptools, llhttp's C parser),
before a request reaches the app:

- **Header deadline.** A request's headers must arrive within ``header_timeout_s`` of the moment the
  connection was accepted (TLS handshake included), and again after each response. uvicorn closes idle
  keep-alive connections but has no deadline for headers that trickle in a byte at a time (slowloris),
  which would hold a connection, and a slot of ``max_connections``, forever. (The body has its own
  deadline, :class:`server.door.body_limit.BodyLimitMiddleware`.)
- **Header caps.** At most ``max_headers`` header lines and ``max_header_bytes`` bytes of request line
  plus headers, counted as the parser reads them, however the bytes arrive (one read or many): over
  either, ``431`` and the connection is closed. Nothing an unauthenticated client sends grows without
  bound before the door (:mod:`server.door.key_check`) runs.
- **Who holds the connections.** At most ``per_address`` connections from one address that no request
  has passed the door on yet, at most ``per_key`` that one key's requests passed it on, and the oldest
  idle unvouched one (else the oldest idle one of the key holding the most) closed when a new connection
  would fill ``--max-connections`` (:mod:`server.door.pool`): neither a keyless flood of idle
  connections nor one key's can take the slots other key holders need.
- **Pipelining.** At most ``MAX_PIPELINED`` requests queued on one connection behind the one being
  answered (the parser would otherwise read a whole buffer of tiny requests, each a queued object,
  before the door has refused the first): over it, 400 and a close.
- **Framing.** Content-Length with Transfer-Encoding (a request two parsers can read two ways:
  smuggling, RFC 9112 section 6.1) and bytes that are not HTTP get ``400`` and a close.

Refusals are JSON in the API's error shape (``error``, ``message``, ``request_id``, the
``X-Request-ID`` header). What is logged about them is throttled per client address
(:class:`server.door.address_log.AddressLog`): a flood of bad connections writes a line per address per interval, with the
count, never one per connection.

With TLS, :func:`connection_protocol` wraps the protocol in :class:`server.door.tls.HandshakeProtocol` at
accept: the handshake gets the header deadline and the connection counts toward ``max_connections``
while it handshakes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import uuid
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.door.address_log import AddressLog
from server.door.pool import DoorPool
from server.door.tls import HandshakeProtocol

CONNECTION_SCOPE_KEY = "xlnetqa.connection"  # the request's connection, for the door to vouch for
MAX_PIPELINED = 16
MIN_DELAY_S = 0.01


class Refusal(Exception):
    """A request refused while its head was parsed: status, error kind and message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


_REASONS = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}


def refusal_bytes(refusal: Refusal) -> bytes:
    """The whole response to a refused request: JSON in the API's error shape, then the connection closes."""
    request_id = uuid.uuid4().hex
    body = json.dumps({"error": refusal.kind, "message": refusal.message, "request_id": request_id}).encode()
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\nx-request-id: %s\r\n\r\n"
    ) % (refusal.status, _REASONS.get(refusal.status, b""), len(body), request_id.encode())
    return head + body


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline, header caps and framing rules above."""

    # This process's connection rules, set by ``python -m server`` and by each worker's app factory.
    header_timeout_s: float = 10.0
    max_headers: int = 100
    max_header_bytes: int = 16384
    tls: ssl.SSLContext | None = None
    per_address: int | None = None  # unvouched connections one address may hold (None: no cap)
    per_key: int | None = None  # connections one key's requests may hold (None: no cap)
    address_log = AddressLog()
    pool = DoorPool()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._accepted = False
        self._accepted_at = self.loop.time()
        self._header_timer: asyncio.TimerHandle | None = None
        self._handshake: HandshakeProtocol | None = None
        self._head_bytes = 0
        self._head_count = 0
        self._framing: set[bytes] = set()
        self.lingering = False  # a refusal is reading the refused body (idle, for the pool)

    # ---- the header deadline --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn
        super().connection_made(transport)
        if not self._accepted:  # plain HTTP: accepted now (under TLS, when the handshake began)
            self.accepted(transport)
        if transport.is_closing():
            return
        elapsed = self.loop.time() - self._accepted_at  # a TLS handshake already took this much
        self._arm_header_timer(max(MIN_DELAY_S, self.header_timeout_s - elapsed))

    # ---- connections before the door ------------------------------------------------------------

    def accepted(self, transport: asyncio.BaseTransport) -> None:
        """A TCP connection was accepted: count it as unvouched, or close it (see server.door.pool)."""
        self._accepted = True
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "unknown"
        over_cap: list[GuardedHttpProtocol] = self.pool.accept(self, address, self.per_address)
        for connection in over_cap:
            connection.close_idle()
        if over_cap:
            self.address_log.warn(
                address, "unvouched",
                f"closed idle connections: over {self.per_address} at once that no request with a valid key has used",
            )  # fmt: skip
        evicted: list[GuardedHttpProtocol] = self.pool.make_room(
            len(self.connections), self.limit_concurrency, self
        )
        for connection in evicted:
            connection.close_idle()
        if evicted:
            self.address_log.warn(
                "*",
                "evicted",
                "closed idle connections (unvouched first, else the largest key's) to make room",
            )

    @property
    def idle(self) -> bool:
        """No request in progress, or only a refusal reading the refused body (nothing the client is owed
        is cut short by closing it)."""
        return self.cycle is None or self.cycle.response_complete or self.lingering

    @property
    def pool_nearly_full(self) -> bool:
        """Nine tenths of ``--max-connections`` are taken: no refusal lingers to read a body now."""
        limit = self.limit_concurrency
        return limit is not None and len(self.connections) * 10 >= limit * 9

    def vouch(self, key: str) -> None:
        """A request of ``key`` on this connection passed the door (server.door.key_check): it is the key's now,
        and the key's oldest idle connection goes if it holds more than ``per_key``."""
        over_cap: list[GuardedHttpProtocol] = self.pool.vouch(self, key, self.per_key)
        for connection in over_cap:
            connection.close_idle()
        if over_cap:
            self.address_log.warn(
                key, "per_key", f"closed idle connections of this key: over {self.per_key} at once"
            )

    def close_idle(self) -> None:
        if self.transport is not None:
            self.transport.close()
        elif self._handshake is not None and self._handshake.raw_transport is not None:
            self._handshake.raw_transport.close()

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
            self.address_log.warn(
                self._address(), "slow_headers",
                f"closed a connection whose request headers took over {self.header_timeout_s:g} s",
            )  # fmt: skip
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer(self.header_timeout_s)  # the next request gets its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self.pool.forget(self)
        super().connection_lost(exc)

    # ---- caps and framing, counted as the parser reads ------------------------------------------

    def on_message_begin(self) -> None:
        self._head_bytes, self._head_count, self._framing = 0, 0, set()
        self.lingering = False
        super().on_message_begin()
        self.scope[CONNECTION_SCOPE_KEY] = self  # type: ignore[literal-required]  # the door vouches for it

    def _count(self, n_bytes: int) -> None:
        self._head_bytes += n_bytes
        if self._head_bytes > self.max_header_bytes:
            raise Refusal(
                431, "headers_too_large",
                f"the request line and headers are over {self.max_header_bytes} bytes",
            )  # fmt: skip

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.max_headers:
            raise Refusal(431, "too_many_headers", f"the request has over {self.max_headers} header lines")
        self._count(len(name) + len(value) + 4)
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self._framing.add(lowered)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if len(self._framing) == 2:
            raise Refusal(*_BAD_FRAMING)
        if len(self.pipeline) >= MAX_PIPELINED:  # requests queued behind one still being answered
            raise Refusal(
                400, "too_many_pipelined",
                f"over {MAX_PIPELINED} requests sent before their answers on one connection",
            )  # fmt: skip
        self._cancel_header_timer()  # this request's headers are in
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, Refusal):
                raise
            self._refuse(cause)
        except httptools.HttpParserUpgrade:
            # No WebSocket here: the upgrade request is a plain request (the door answers it) and the
            # connection closes after its response (the parser reads nothing more of it).
            if self.cycle is not None:
                self.cycle.keep_alive = False
        except httptools.HttpParserError as exc:
            # llhttp refuses Content-Length with Transfer-Encoding itself, as soon as it reads the second
            both = len(self._framing) == 2 or (
                "Content-Length" in str(exc) and "Transfer-Encoding" in str(exc)
            )
            self._refuse(Refusal(*(_BAD_FRAMING if both else _NOT_HTTP)))

    def _refuse(self, refusal: Refusal) -> None:
        self._cancel_header_timer()
        if _refusal_counter is not None:
            _refusal_counter(refusal.kind)
        self.address_log.warn(
            self._address(), refusal.kind, f"refused a request ({refusal.status}): {refusal.message}"
        )
        if not self.transport.is_closing():
            self.transport.write(refusal_bytes(refusal))
            self.transport.close()

    def _address(self) -> str:
        return self.client[0] if self.client else "unknown"

    def shutdown(self) -> None:
        """On server shutdown: a connection still in its TLS handshake has no HTTP transport yet."""
        if self.transport is None:
            raw = self._handshake.raw_transport if self._handshake is not None else None
            if raw is not None:
                raw.close()
            return
        super().shutdown()


_refusal_counter: Callable[[str], None] | None = None


def count_refusals_with(counter: Callable[[str], None] | None) -> None:
    """Count each refusal by its error kind (the app's metrics), or stop counting (None)."""
    global _refusal_counter
    _refusal_counter = counter


_BAD_FRAMING = (400, "bad_framing", "a request may have Content-Length or Transfer-Encoding, not both")
_NOT_HTTP = (400, "bad_request", "the request is not valid HTTP/1.1")


def connection_protocol(*args: Any, **kwargs: Any) -> asyncio.Protocol:
    """uvicorn's ``http`` protocol factory (its arguments as uvicorn passes them): the HTTP protocol,
    wrapped in TLS at accept when this process serves HTTPS."""
    http = GuardedHttpProtocol(*args, **kwargs)
    if GuardedHttpProtocol.tls is None:
        return http
    http.connections.add(http)  # counted from the accept, not from the end of the handshake
    http._handshake = HandshakeProtocol(
        http, GuardedHttpProtocol.tls, GuardedHttpProtocol.header_timeout_s,
        released=lambda: _released(http), accepted=http.accepted,
    )  # fmt: skip
    return http._handshake


def _released(http: GuardedHttpProtocol) -> None:
    http.connections.discard(http)
    http.pool.forget(http)


class _HttpsInStartLine(logging.Filter):
    """uvicorn's "running on http://..." line names the scheme of TLS it does itself; ours is https."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Uvicorn running on") and record.args:
            args = tuple(record.args) if isinstance(record.args, tuple) else (record.args,)
            record.args = ("https", *args[1:]) if args[0] == "http" else args
        return True


def configure_connections(
    header_timeout_s: float,
    tls: ssl.SSLContext | None,
    max_headers: int = 100,
    max_header_bytes: int = 16384,
    per_address: int | None = None,
    per_key: int | None = None,
) -> None:
    """This process's connection rules: the header deadline, the header caps, the unvouched connections
    one address may hold, the connections one key may hold, and TLS (None: plain HTTP)."""
    GuardedHttpProtocol.per_address = per_address
    GuardedHttpProtocol.per_key = per_key
    GuardedHttpProtocol.header_timeout_s = header_timeout_s
    GuardedHttpProtocol.max_headers = max_headers
    GuardedHttpProtocol.max_header_bytes = max_header_bytes
    GuardedHttpProtocol.tls = tls
    if tls is not None:
        logging.getLogger("uvicorn.error").addFilter(_HttpsInStartLine())
