"""A lean HTTP/1.1 load client for loopback benchmarks: keep-alive connections, requests encoded once.

httpx spends a few hundred microseconds of CPU on each request; on a 2-core machine that shares its
cores with the server under test, the client would be a large part of what is measured. This client
sends pre-encoded bytes and reads a ``Content-Length`` response with no more parsing than the status
line and headers need (no TLS, no chunked bodies: what the servers measured here send), so the
numbers are the server's, and the same client measures every server of a run (the echo floor too).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

_HEADER_END = b"\r\n\r\n"
T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop where it is installed (a leaner client), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


@dataclass
class Reply:
    """One response: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


class ProtocolError(RuntimeError):
    """The server sent something this client does not read (or closed the connection)."""


def encode_post(
    host: str, port: int, path: str, body: bytes, headers: Mapping[str, str] | None = None
) -> bytes:
    """The bytes of one keep-alive ``POST path`` with a JSON body."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One kept-alive connection; reconnects when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, raw: bytes) -> Reply:
        if self._writer is None or self._writer.is_closing():
            await self._open()
        assert self._reader is not None and self._writer is not None
        self._writer.write(raw)
        try:
            head = await self._reader.readuntil(_HEADER_END)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise ProtocolError(f"connection closed before a response ({exc})") from None
        status_line, *header_lines = head[: -len(_HEADER_END)].decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            await self.close()
            raise ProtocolError(f"not an HTTP status line: {status_line[:80]!r}")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            await self.close()
            raise ProtocolError("a response without Content-Length")
        body = await self._reader.readexactly(int(headers["content-length"]))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return Reply(int(parts[1]), headers, body)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._reader = self._writer = None


@dataclass
class LoadResult:
    """What a closed loop measured: seconds, latencies of the 2xx replies, and the other outcomes."""

    seconds: float
    latencies: list[float]
    errors: int


async def closed_loop(
    host: str,
    port: int,
    requests: Sequence[bytes],
    clients: int,
    seconds: float,
    on_reply: Callable[[Reply, float], None] | None = None,
) -> LoadResult:
    """``clients`` connections each send the next of ``requests`` as soon as the previous reply is in,
    for ``seconds``; client ``i`` starts at request ``7 * i`` so the clients do not move in step."""
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    errors = 0

    async def client(i: int) -> None:
        nonlocal errors
        conn, k = Connection(host, port), 7 * i
        try:
            while time.perf_counter() < deadline:
                raw = requests[k % len(requests)]
                k += 1
                start = time.perf_counter()
                try:
                    reply = await conn.request(raw)
                except (ProtocolError, OSError):
                    errors += 1
                    continue
                latency = time.perf_counter() - start
                if 200 <= reply.status < 300:
                    latencies.append(latency)
                else:
                    errors += 1
                if on_reply is not None:
                    on_reply(reply, latency)
        finally:
            await conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return LoadResult(time.perf_counter() - start, latencies, errors)


async def one_at_a_time(
    host: str, port: int, requests: Sequence[bytes], warmup: int = 3
) -> list[tuple[Reply, float]]:
    """Each request once, in order, on one connection (after ``warmup`` unmeasured ones)."""
    conn = Connection(host, port)
    try:
        for raw in requests[:warmup]:
            await conn.request(raw)
        out = []
        for raw in requests:
            start = time.perf_counter()
            reply = await conn.request(raw)
            out.append((reply, time.perf_counter() - start))
        return out
    finally:
        await conn.close()
