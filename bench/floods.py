"""Floods from clients with no key (or a tenant's own), and a key holder measured beside them: what
``bench.abuse --flood`` reports and the attack tests assert.

- :class:`ConnectionFlood`: keeps ``connections`` idle TCP connections open from one address, sending
  nothing, opening a new one (at most ``per_second``) whenever the server closes one.
- :class:`HeaderFlood`: keyless requests whose header block is ``block_bytes`` long, sent whole in one
  write, at about ``bytes_per_second``.
- :class:`TokenizerFlood`: a tenant with a valid key sending contexts of ``chars`` characters that the
  server tokenizes and then refuses (413: too many windows), at ``per_second`` requests.

Each runs in a thread of its own with its own event loop, started and stopped as a context manager.
:func:`key_holder` sends ``n`` requests one after another, each on a new connection, and returns
(status or error name, seconds) for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx


class _Flood:
    """A coroutine run in its own thread and loop until ``stop``; ``tally`` counts what it saw."""

    def __init__(self) -> None:
        self.tally: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        task = asyncio.ensure_future(self.flood())
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
            if task.done():
                break
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    def flood(self) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


class ConnectionFlood(_Flood):
    def __init__(self, host: str, port: int, connections: int, per_second: float = 200.0) -> None:
        super().__init__()
        self.host, self.port, self.connections, self.per_second = host, port, connections, per_second

    async def flood(self) -> None:
        held: set[asyncio.Task] = set()

        async def hold() -> None:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                self.tally["refused"] += 1
                return
            self.tally["opened"] += 1
            try:
                await reader.read()  # nothing is sent; returns when the server closes the connection
                self.tally["closed by the server"] += 1
            finally:
                writer.close()

        gap = 1.0 / self.per_second
        while True:
            held = {t for t in held if not t.done()}
            if len(held) < self.connections:
                held.add(asyncio.ensure_future(hold()))
                await asyncio.sleep(gap)
            else:
                await asyncio.sleep(0.01)


class HeaderFlood(_Flood):
    def __init__(self, host: str, port: int, block_bytes: int, bytes_per_second: float = 1e6) -> None:
        super().__init__()
        self.host, self.port, self.block_bytes, self.bytes_per_second = (
            host,
            port,
            block_bytes,
            bytes_per_second,
        )

    def request(self) -> bytes:
        line = b"X-Padding: " + b"a" * 200 + b"\r\n"
        lines = line * max(1, self.block_bytes // len(line))
        return b"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n" + lines + b"\r\n{}"

    async def flood(self) -> None:
        raw = self.request()
        gap = len(raw) / self.bytes_per_second
        while True:
            started = time.perf_counter()
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(raw)
                head = await asyncio.wait_for(reader.read(200), 5)
                self.tally[head[9:12].decode("latin-1", "replace") or "closed"] += 1
                writer.close()
            except (OSError, asyncio.TimeoutError) as exc:
                self.tally[type(exc).__name__] += 1
            await asyncio.sleep(max(0.0, gap - (time.perf_counter() - started)))


class TokenizerFlood(_Flood):
    def __init__(self, url: str, key: str, chars: int, per_second: float) -> None:
        super().__init__()
        self.url, self.key, self.chars, self.per_second = url, key, chars, per_second

    async def flood(self) -> None:
        words = "The committee reviewed the annual report and approved the budget for next year. "
        context = (words * (self.chars // len(words) + 1))[: self.chars]
        body = {"question": "What was approved?", "context": context}
        headers = {"Authorization": f"Bearer {self.key}"}
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:

            async def one() -> None:
                try:
                    r = await client.post("/answer", json=body, headers=headers)
                    self.tally[str(r.status_code)] += 1
                except httpx.HTTPError as exc:
                    self.tally[type(exc).__name__] += 1

            tasks: set[asyncio.Task] = set()
            while True:
                tasks = {t for t in tasks if not t.done()}
                tasks.add(asyncio.ensure_future(one()))
                await asyncio.sleep(1.0 / self.per_second)


def key_holder(
    url: str, key: str | None, n: int, ca: Path | None = None, timeout: float = 20.0, body: dict | None = None
) -> list[tuple[str, float]]:
    """``n`` requests one after another, each on a new connection: (status or error, seconds) each."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    verify: bool | ssl.SSLContext = ssl.create_default_context(cafile=str(ca)) if ca else True
    body = body or {"question": "What happened?", "context": "Something happened here."}
    out = []
    for _ in range(n):
        start = time.perf_counter()
        try:
            with httpx.Client(base_url=url, timeout=timeout, verify=verify) as client:
                outcome = str(client.post("/answer", json=body, headers=headers).status_code)
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        out.append((outcome, time.perf_counter() - start))
    return out
