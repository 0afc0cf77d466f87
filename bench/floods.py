"""Floods from clients with no key (or a tenant's own): what ``bench.abuse --flood`` reports and the attack
tests assert (the scenarios, and the key holder measured beside them, are :mod:`bench.flood_scenarios`).

- :class:`ConnectionFlood`: keeps ``connections`` idle TCP connections open from one address, sending
  nothing, opening a new one (at most ``per_second``) whenever the server closes one.
- :class:`HeaderFlood`: keyless requests whose header block is ``block_bytes`` long, each sent whole in
  one write on a connection of its own, at ``bytes_per_second`` (open loop: it does not wait for answers).
- :class:`TokenizerFlood`: a tenant with a valid key sending ``chars`` characters of context per
  request (``/v1/answer/batch`` items of 20,000, each within the per-context limit) that the server
  tokenizes and then refuses (413: too many tokens or windows), at ``per_second`` requests.
- :class:`KeyConnectionFlood`: a valid key holding ``connections`` keep-alive connections, each sending a
  keyed request (a probe by default) every ``interval_s``, reconnecting when the server closes one.
- :class:`LingerFlood`: keyless requests from ``addresses`` client addresses (127.0.0.2 and up) that
  declare a body of ``body_bytes`` and send none of it, each on a connection of its own, at
  ``per_second`` (the refusal would wait for the body).
- :class:`MetricsFlood`: on the metrics port, ``half_open`` connections that send half a request
  (``GET /metr``) and nothing more, and ``per_second`` whole scrapes.
- :class:`BatchFlood`: a tenant with a valid key keeping ``concurrency`` ``/v1/answer/batch`` requests in
  flight, each of ``items`` contexts of ``chars`` characters (a new text each time).

Each runs in a thread of its own with its own event loop, started and stopped as a context manager;
``python -m bench.floods KIND`` (and :func:`flood_process`) runs one in a process of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import resource
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any
from urllib.parse import urlparse

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

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection, counted as ``opened`` (or ``refused``, then None)."""
        try:
            opened = await asyncio.open_connection(host, port)
        except OSError:
            self.tally["refused"] += 1
            return None
        self.tally["opened"] += 1
        return opened

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
            opened = await self._open(self.host, self.port)
            if opened is None:
                return
            reader, writer = opened
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
        return b"POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n" + lines + b"\r\n{}"

    async def flood(self) -> None:
        """Open loop: a request every ``len(request) / bytes_per_second`` seconds whatever the server does
        (at most 64 unanswered at once), each on a connection of its own."""
        raw = self.request()
        gap = len(raw) / self.bytes_per_second

        async def one() -> None:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(raw)
                head = await asyncio.wait_for(reader.read(200), 10)
                self.tally[head[9:12].decode("latin-1", "replace") or "closed"] += 1
                writer.close()
            except (OSError, asyncio.TimeoutError) as exc:
                self.tally[type(exc).__name__] += 1

        pending: set[asyncio.Task] = set()
        while True:
            pending = {t for t in pending if not t.done()}
            if len(pending) < 64:
                pending.add(asyncio.ensure_future(one()))
            else:
                self.tally["skipped: 64 unanswered"] += 1
            await asyncio.sleep(gap)


class TokenizerFlood(_Flood):
    def __init__(self, url: str, key: str, chars: int, per_second: float) -> None:
        super().__init__()
        self.url, self.key, self.chars, self.per_second = url, key, chars, per_second

    async def flood(self) -> None:
        words = "The committee reviewed the annual report and approved the budget for next year. "
        per_item = 20000  # the server's default max_context_chars: longer texts go as several items
        text = (words * (self.chars // len(words) + 1))[: self.chars]
        items = [{"question": "What was approved?", "context": text[k : k + per_item]}
                 for k in range(0, len(text), per_item)]  # fmt: skip
        headers = {"Authorization": f"Bearer {self.key}"}
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:

            async def one() -> None:
                try:
                    r = await client.post("/v1/answer/batch", json={"items": items}, headers=headers)
                    self.tally[str(r.status_code)] += 1
                except httpx.HTTPError as exc:
                    self.tally[type(exc).__name__] += 1

            tasks: set[asyncio.Task] = set()
            while True:
                tasks = {t for t in tasks if not t.done()}
                tasks.add(asyncio.ensure_future(one()))
                await asyncio.sleep(1.0 / self.per_second)


async def _read_response(reader: asyncio.StreamReader, timeout: float = 10.0) -> str:
    """The status of one HTTP/1.1 response (its body read and dropped); "closed" if the server closed."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length:
        await asyncio.wait_for(reader.readexactly(length), timeout)
    return head[9:12].decode("latin-1", "replace")


async def _hold_up_to(count: int, per_second: float, one: Any) -> None:
    """Keep ``count`` tasks of ``one()`` running, starting at most ``per_second`` new ones a second."""
    held: set[asyncio.Task] = set()
    gap = 1.0 / per_second
    while True:
        held = {t for t in held if not t.done()}
        if len(held) < count:
            held.add(asyncio.ensure_future(one()))
            await asyncio.sleep(gap)
        else:
            await asyncio.sleep(0.01)


class KeyConnectionFlood(_Flood):
    def __init__(
        self, host: str, port: int, key: str, connections: int, per_second: float = 200.0,
        path: str = "/healthz", interval_s: float = 3.5,
    ) -> None:  # fmt: skip
        super().__init__()
        self.host, self.port, self.key, self.connections = host, port, key, connections
        self.per_second, self.path, self.interval_s = per_second, path, interval_s

    async def flood(self) -> None:
        request = (
            f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.key}\r\n\r\n"
        ).encode()

        async def hold() -> None:
            opened = await self._open(self.host, self.port)
            if opened is None:
                return
            reader, writer = opened
            try:
                while True:
                    writer.write(request)
                    self.tally[await _read_response(reader)] += 1
                    await asyncio.sleep(self.interval_s)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                self.tally["closed by the server"] += 1
            finally:
                writer.close()

        await _hold_up_to(self.connections, self.per_second, hold)


class LingerFlood(_Flood):
    def __init__(
        self,
        host: str,
        port: int,
        addresses: int = 16,
        per_second: float = 300.0,
        body_bytes: int = 1_000_000,
    ) -> None:
        super().__init__()
        self.host, self.port, self.addresses = host, port, addresses
        self.per_second, self.body_bytes = per_second, body_bytes

    async def flood(self) -> None:
        """Open loop: a request every ``1 / per_second`` seconds whatever the server does (at most 4,000
        unanswered at once), from the addresses in turn."""
        head = (
            "POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {self.body_bytes}\r\n\r\n"
        ).encode()
        sources = itertools.cycle(f"127.0.0.{2 + k}" for k in range(self.addresses))

        async def one(source: str) -> None:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port, local_addr=(source, 0))
            except OSError as exc:
                self.tally[type(exc).__name__] += 1
                return
            try:
                writer.write(head)  # and never the body
                self.tally[await _read_response(reader, timeout=15)] += 1
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
                self.tally[type(exc).__name__] += 1
            finally:
                writer.close()

        pending: set[asyncio.Task] = set()
        while True:
            pending = {t for t in pending if not t.done()}
            if len(pending) < 4000:
                pending.add(asyncio.ensure_future(one(next(sources))))
            else:
                self.tally["skipped: 4000 unanswered"] += 1
            await asyncio.sleep(1.0 / self.per_second)


class MetricsFlood(_Flood):
    def __init__(self, host: str, port: int, half_open: int, per_second: float) -> None:
        super().__init__()
        self.host, self.port, self.half_open, self.per_second = host, port, half_open, per_second

    async def flood(self) -> None:
        async def half() -> None:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 10)
            except (OSError, asyncio.TimeoutError) as exc:
                self.tally[f"half-open: {type(exc).__name__}"] += 1
                return
            self.tally["half-open"] += 1
            try:
                writer.write(b"GET /metr")
                await reader.read()  # until the server closes it
                self.tally["half-open: closed by the server"] += 1
            except OSError:
                self.tally["half-open: reset"] += 1
            finally:
                writer.close()

        async def scrape() -> None:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 10)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                self.tally[f"scrape {await _read_response(reader)}"] += 1
                writer.close()
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
                self.tally[f"scrape: {type(exc).__name__}"] += 1

        holding = asyncio.ensure_future(_hold_up_to(self.half_open, 2000.0, half))
        pending: set[asyncio.Task] = set()
        try:
            while True:
                pending = {t for t in pending if not t.done()}
                if len(pending) < 2000:
                    pending.add(asyncio.ensure_future(scrape()))
                await asyncio.sleep(1.0 / self.per_second)
        finally:
            holding.cancel()


class BatchFlood(_Flood):
    def __init__(self, url: str, key: str, concurrency: int = 16, items: int = 2, chars: int = 20000) -> None:
        super().__init__()
        self.url, self.key, self.concurrency, self.items, self.chars = url, key, concurrency, items, chars

    async def flood(self) -> None:
        words = "The committee reviewed the annual report and approved the budget for next year. "
        base = (words * (self.chars // len(words) + 1))[: self.chars - 12]
        serial = itertools.count()
        headers = {"Authorization": f"Bearer {self.key}"}
        async with httpx.AsyncClient(
            base_url=self.url, timeout=60, limits=httpx.Limits(max_connections=64)
        ) as client:

            async def loop() -> None:
                while True:
                    items = [{"question": "What was approved?", "context": f"Report {next(serial) % int(__import__('os').environ.get('XQ_TEXTS', '1000000')):06d}. {base}"[: self.chars]}
                             for _ in range(self.items)]  # fmt: skip
                    try:
                        r = await client.post("/v1/answer/batch", json={"items": items}, headers=headers)
                        self.tally[str(r.status_code)] += 1
                        if r.status_code != 200:
                            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                    except httpx.HTTPError as exc:
                        self.tally[type(exc).__name__] += 1

            await asyncio.gather(*(loop() for _ in range(self.concurrency)))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.floods KIND ...``: one flood for ``--seconds`` in a process of its own (so it
    shares no interpreter lock with whoever measures beside it); prints what it saw as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.floods", description=main.__doc__)
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--url", required=True, help="http(s)://127.0.0.1:PORT")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--connections", type=int, default=2200, help="connections, key-connections: how many to hold"
    )
    p.add_argument("--per-second", type=float, default=200.0, help="connections opened / requests sent per s")
    p.add_argument("--block-bytes", type=int, default=16384, help="headers: the header block's size")
    p.add_argument("--bytes-per-second", type=float, default=1e6, help="headers: the flood's rate")
    p.add_argument("--key", help="tokenizer, key-connections, batches: the tenant's key")
    p.add_argument("--chars", type=int, default=60000, help="tokenizer, batches: characters per context")
    p.add_argument("--path", default="/healthz", help="key-connections: what each connection asks")
    p.add_argument("--addresses", type=int, default=16, help="lingering: client addresses (127.0.0.2 on)")
    p.add_argument("--half-open", type=int, default=2000, help="metrics: half-sent connections to hold")
    p.add_argument("--concurrency", type=int, default=16, help="batches: requests in flight")
    args = p.parse_args(argv)
    parsed = urlparse(args.url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    if args.kind in ("tokenizer", "key-connections", "batches") and not args.key:
        p.error(f"{args.kind} needs --key")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # thousands of sockets
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    flood: _Flood
    if args.kind == "connections":
        flood = ConnectionFlood(host, port, args.connections, args.per_second)
    elif args.kind == "headers":
        flood = HeaderFlood(host, port, args.block_bytes, args.bytes_per_second)
    elif args.kind == "tokenizer":
        flood = TokenizerFlood(args.url, args.key, args.chars, args.per_second)
    elif args.kind == "key-connections":
        flood = KeyConnectionFlood(host, port, args.key, args.connections, args.per_second, args.path)
    elif args.kind == "lingering":
        flood = LingerFlood(host, port, args.addresses, args.per_second)
    elif args.kind == "metrics":
        flood = MetricsFlood(host, port, args.half_open, args.per_second)
    else:
        flood = BatchFlood(args.url, args.key, args.concurrency, chars=args.chars)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with flood:
        stop.wait(args.seconds)
    print(json.dumps(dict(flood.tally)), flush=True)
    return 0


KINDS = ("connections", "headers", "tokenizer", "key-connections", "lingering", "metrics", "batches")


class FloodProcess:
    """``python -m bench.floods KIND ...`` as a child process; ``tally`` is what it saw, once stopped."""

    def __init__(self, kind: str, url: str, *options: str) -> None:
        from harness.server_process import REPO, child_env

        command = [sys.executable, "-m", "bench.floods", kind, "--url", url, "--seconds", "3600", *options]
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.tally: dict[str, int] = {}

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        lines = out.strip().splitlines()
        if not lines:
            raise RuntimeError(f"the flood reported nothing: {err[-2000:]}")
        self.tally = json.loads(lines[-1])


@contextlib.contextmanager
def flood_process(kind: str, url: str, *options: str) -> Iterator[FloodProcess]:
    """A :class:`FloodProcess` running until the block ends (its ``tally`` is read then)."""
    flood = FloodProcess(kind, url, *options)
    try:
        yield flood
    finally:
        flood.stop()


if __name__ == "__main__":
    sys.exit(main())
