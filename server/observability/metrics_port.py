"""``python -m server.observability.metrics_port``: the process that answers ``--metrics-port`` (started by
:mod:`server.observability.metrics_listener`, never by hand).

A scraper on this port must never slow the API, so it is served here, in a process of its own, and
cheaply: at most ``MAX_CONNECTIONS`` at once (beyond them the listening socket is not read at all, so a
connection flood waits in the kernel's backlog and costs no CPU here), a request head within
``HEAD_TIMEOUT_S`` and the whole exchange within ``CONNECTION_TIMEOUT_S``, only ``GET`` or ``HEAD
/metrics`` with an HTTP/1.x request line (anything else, HTTP/0.9 and half-sent heads included, is
closed without a body), one answer per connection. The exposition is rendered at most once per
``CACHE_S``: scrapes in between get the same bytes, so a flood of scrapes renders (and takes the
metrics' locks in the server) once a second at most.

The rendering comes from the server's process over an inherited socket (``--source-fd``: one byte
asks, a length-prefixed exposition answers), or, with front processes, from prometheus-client's
multiprocess directory read here (``--directory``). The listening socket is inherited too
(``--listen-fd``), bound by the server before it started, so a port in use is the server's one error
at start. The process exits when the server's process does (even by ``kill -9``: its parent changes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

MAX_CONNECTIONS = 32
HEAD_TIMEOUT_S = 2.0
CONNECTION_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 8192
CACHE_S = 1.0
PARENT_CHECK_S = 0.5
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_LENGTH = struct.Struct(">I")


class CachedRender:
    """``render()`` at most once per ``CACHE_S``; concurrent callers share the one in flight."""

    def __init__(self, render: Callable[[], Awaitable[bytes]]) -> None:
        self._render = render
        self._body = b""
        self._at = -CACHE_S
        self._pending: asyncio.Future[bytes] | None = None

    async def get(self) -> bytes:
        """The cached rendering, or a new one. A scrape that gives up (its deadline) never cancels the
        rendering itself: it is one exchange on the socket to the server, which must be read whole."""
        if time.monotonic() - self._at < CACHE_S:
            return self._body
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._render())
            self._pending.add_done_callback(self._rendered)
        return await asyncio.shield(self._pending)

    def _rendered(self, done: asyncio.Future[bytes]) -> None:
        self._pending = None
        if not done.cancelled() and done.exception() is None:
            self._body, self._at = done.result(), time.monotonic()


def from_server(source: socket.socket) -> Callable[[], Awaitable[bytes]]:
    """Rendering asked of the server's process over ``source``."""
    lock = asyncio.Lock()

    async def render() -> bytes:
        loop = asyncio.get_running_loop()
        async with lock:
            await loop.sock_sendall(source, b"r")
            head = await _read_exactly(loop, source, _LENGTH.size)
            return await _read_exactly(loop, source, _LENGTH.unpack(head)[0])

    return render


def from_directory(directory: str) -> Callable[[], Awaitable[bytes]]:
    """Rendering of every process's values in prometheus-client's multiprocess ``directory``."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    from server.observability.metrics import forget_dead_workers

    async def render() -> bytes:
        def once() -> bytes:
            forget_dead_workers(directory)
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=directory)
            return generate_latest(registry)

        return await asyncio.to_thread(once)

    return render


async def _read_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await loop.sock_recv(sock, n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the metrics source")
        data += chunk
    return bytes(data)


def parse_head(head: bytes) -> tuple[str, str] | None:
    """``(method, path)`` of an HTTP/1.x GET or HEAD request line, or None for anything else."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD") or not parts[2].startswith(b"HTTP/1."):
        return None
    return parts[0].decode(), parts[1].split(b"?", 1)[0].decode("latin-1")


def response(method: str, path: str, body: bytes) -> bytes:
    if path != "/metrics":
        status, body, kind = b"404 Not Found", b"not found: the metrics are at /metrics\n", b"text/plain"
    else:
        status, kind = b"200 OK", CONTENT_TYPE
    head = b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
        status, kind, len(body),
    )  # fmt: skip
    return head if method == "HEAD" else head + body


class MetricsPort:
    """Serves ``listener`` (a bound, listening socket) from ``render`` (see the module docstring)."""

    def __init__(self, listener: socket.socket, render: Callable[[], Awaitable[bytes]]) -> None:
        self.listener, self.cache = listener, CachedRender(render)
        self.open = 0
        self._loop = asyncio.get_event_loop()
        self._tasks: set[asyncio.Task] = set()
        listener.setblocking(False)

    def start(self) -> None:
        self._loop.add_reader(self.listener.fileno(), self._accept)

    def _accept(self) -> None:
        while self.open < MAX_CONNECTIONS:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # the peer left before we accepted (ECONNABORTED), or out of descriptors
            conn.setblocking(False)
            self.open += 1
            task = self._loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._loop.remove_reader(self.listener.fileno())  # full: the backlog waits, costing nothing here

    def _closed(self) -> None:
        self.open -= 1
        if self.open == MAX_CONNECTIONS - 1:
            self._loop.add_reader(self.listener.fileno(), self._accept)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await asyncio.wait_for(self._exchange(conn), CONNECTION_TIMEOUT_S)
        except (asyncio.TimeoutError, OSError, ConnectionError):
            pass
        finally:
            conn.close()
            self._closed()

    async def _exchange(self, conn: socket.socket) -> None:
        head = bytearray()
        deadline = self._loop.time() + HEAD_TIMEOUT_S
        while b"\r\n\r\n" not in head:
            if len(head) > MAX_HEAD_BYTES:
                return
            chunk = await asyncio.wait_for(self._loop.sock_recv(conn, 4096), deadline - self._loop.time())
            if not chunk:
                return  # closed before a whole head: HTTP/0.9 and half-sent requests get nothing
            head += chunk
        parsed = parse_head(bytes(head))
        if parsed is None:
            return
        method, path = parsed
        body = await self.cache.get() if path == "/metrics" else b""
        await self._loop.sock_sendall(conn, response(method, path, body))


async def _serve(listen_fd: int, source_fd: int | None, directory: str | None) -> None:
    parent = os.getppid()
    listener = socket.socket(fileno=listen_fd)
    if directory:
        render = from_directory(directory)
    else:
        assert source_fd is not None
        source = socket.socket(fileno=source_fd)
        source.setblocking(False)
        render = from_server(source)
    MetricsPort(listener, render).start()
    while os.getppid() == parent:  # the server exited (even by kill -9): so does this process
        await asyncio.sleep(PARENT_CHECK_S)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m server.observability.metrics_port", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--listen-fd", type=int, required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--source-fd", type=int, help="a socket to the server's process, which renders")
    source.add_argument("--directory", help="prometheus-client's multiprocess directory, rendered here")
    args = p.parse_args(argv)
    with contextlib.suppress(ConnectionError, KeyboardInterrupt):
        asyncio.run(_serve(args.listen_fd, args.source_fd, args.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
