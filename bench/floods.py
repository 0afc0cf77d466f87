"""Floods from clients with no key (or a tenant's own), and a key holder measured beside them: what
``bench.abuse --flood`` reports and the attack tests assert.

- :class:`ConnectionFlood`: keeps ``connections`` idle TCP connections open from one address, sending
  nothing, opening a new one (at most ``per_second``) whenever the server closes one.
- :class:`HeaderFlood`: keyless requests whose header block is ``block_bytes`` long, each sent whole in
  one write on a connection of its own, at ``bytes_per_second`` (open loop: it does not wait for answers).
- :class:`TokenizerFlood`: a tenant with a valid key sending ``chars`` characters of context per
  request (``/answer/batch`` items of 20,000, each within the per-context limit) that the server
  tokenizes and then refuses (413: too many tokens or windows), at ``per_second`` requests.

Each runs in a thread of its own with its own event loop, started and stopped as a context manager;
``python -m bench.floods KIND`` (and :func:`flood_process`) runs one in a process of its own.
:func:`key_holder` sends ``n`` requests one after another, each on a new connection, and returns
(status or error name, seconds) for each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
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
                    r = await client.post("/answer/batch", json={"items": items}, headers=headers)
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
    # one context for every connection: httpx would load the system's CA bundle for each new client
    # (~18 ms), which is the client's cost, not the server's
    verify = ssl.create_default_context(cafile=str(ca)) if ca else ssl.create_default_context()
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


FLOODS = ("connections", "connections-tls", "headers-16k", "headers-100k", "tokenizer")
KEY_A, KEY_B = "flood-tenant-key-0123456789abcdef", "key-holder-key-fedcba9876543210"


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass(frozen=True)
class FloodSetup:
    """One flood's scenario, the one home ``bench.abuse --flood`` and the attack tests read: the
    server's flags beyond its keys file, the key holder's request (None: a short question) and, under
    TLS, the CA its clients trust."""

    name: str
    flags: tuple[str, ...]
    body: dict[str, str] | None
    ca: Path | None

    def flood(self, url: str, port: int, tenant_key: str) -> tuple[str, ...]:
        """:func:`flood_process`'s arguments against the server at ``url`` (``port``): a connection
        flood never speaks, so it gets plain TCP, TLS or not; the tokenizer flood is ``tenant_key``'s."""
        name = self.name
        if name.startswith("connections"):
            return ("connections", f"http://127.0.0.1:{port}", "--connections", "300", "--per-second", "200")
        if name.startswith("headers-"):
            block = {"headers-16k": 16 * 1024, "headers-100k": 100 * 1024}[name]
            return ("headers", url, "--block-bytes", str(block), "--bytes-per-second", "1000000")
        return ("tokenizer", url, "--key", tenant_key, "--chars", "60000", "--per-second", "20")


def flood_setup(name: str, work: Path) -> FloodSetup:
    """The scenario of flood ``name`` (one of :data:`FLOODS`); TLS certificates are written under ``work``.

    - connections: ``--max-connections 150``, a 3 s header deadline, and a flood of 300 idle connections;
    - headers: the default caps, ~1 MB/s of 16 KB or 100 KB header blocks;
    - tokenizer: the README's example limits per key, at most 64 windows a request (a 60,000-character
      context is ~110), and the key holder's long question on the featurize thread.
    """
    if name not in FLOODS:
        raise ValueError(f"unknown flood {name!r}; one of {', '.join(FLOODS)}")
    if name.startswith("connections"):
        flags: tuple[str, ...] = ("--max-connections", "150", "--header-timeout-s", "3")
        if not name.endswith("tls"):
            return FloodSetup(name, flags, None, None)
        from harness.certificates import make_certificates

        ca, cert, key = make_certificates(work)
        return FloodSetup(name, (*flags, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)), None, ca)
    if name.startswith("headers-"):
        return FloodSetup(name, (), None, None)
    limits = ("--key-requests-per-s", "20", "--key-windows-per-s", "200", "--key-max-inflight-windows", "256")
    words = "The committee reviewed the annual report and approved the budget for next year. "
    body = {"question": "What was approved?", "context": (words * 30)[:2400]}
    return FloodSetup(name, (*limits, "--max-request-windows", "64"), body, None)


def flood_row(
    name: str,
    model: str | Path,
    backend: str,
    work: Path,
    requests: int = 60,
    repo: Path | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """One flood against a fresh server (``repo``'s, under ``python``, when given), with a key holder
    measured before and during it: success rate, p50 and p99 (ms) of each, and the flood's own tally."""
    from harness.server_process import ServerProcess

    work.mkdir(parents=True, exist_ok=True)
    keys = work / "flood-keys.txt"
    keys.write_text(f"tenant: {KEY_A}\nholder: {KEY_B}\n")
    keys.chmod(0o600)
    setup = flood_setup(name, work)
    server = ServerProcess(model, "--api-keys-file", str(keys), *setup.flags, backend=backend, repo=repo,
                           python=python, tls_ca=setup.ca, log_path=work / f"flood-{name}.log")  # fmt: skip
    with server:
        unloaded = key_holder(server.url, KEY_B, requests, ca=setup.ca, body=setup.body)
        with flood_process(*setup.flood(server.url, server.port, KEY_A)) as flood:
            time.sleep(3.0)
            flooded = key_holder(server.url, KEY_B, requests, ca=setup.ca, body=setup.body)
    row: dict[str, Any] = {"flood": name, "tally": flood.tally}
    for phase, outcomes in (("unloaded", unloaded), ("flooded", flooded)):
        ok = [t * 1000 for o, t in outcomes if o == "200"]
        row[phase] = {
            "success": len(ok) / len(outcomes),
            "p50_ms": _p(ok, 0.5),
            "p99_ms": _p(ok, 0.99),
            "outcomes": dict(Counter(o for o, _ in outcomes)),
        }
    return row


def flood_markdown(rows: Sequence[dict[str, Any]], title: str) -> str:
    lines = [f"**{title}**", "", "| flood | key holder unloaded: ok, p50, p99 ms | under the flood: ok, p50, p99 ms | p99 ratio | the flood saw |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        u, f = r["unloaded"], r["flooded"]
        ratio = f["p99_ms"] / u["p99_ms"] if u["p99_ms"] and f["p99_ms"] == f["p99_ms"] else float("nan")
        failures = {k: v for k, v in f["outcomes"].items() if k != "200"}
        lines.append(
            f"| {r['flood']} | {u['success']:.0%}, {u['p50_ms']:.1f}, {u['p99_ms']:.1f} | "
            f"{f['success']:.0%}, {f['p50_ms']:.1f}, {f['p99_ms']:.1f}"
            + (f" (failed: {failures})" if failures else "")
            + f" | {ratio:.2f} | {r['tally']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.floods KIND ...``: one flood for ``--seconds`` in a process of its own (so it
    shares no interpreter lock with whoever measures beside it); prints what it saw as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.floods", description=main.__doc__)
    p.add_argument("kind", choices=("connections", "headers", "tokenizer"))
    p.add_argument("--url", required=True, help="http(s)://127.0.0.1:PORT")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=2200, help="connections: how many to hold")
    p.add_argument("--per-second", type=float, default=200.0, help="connections opened / requests sent per s")
    p.add_argument("--block-bytes", type=int, default=16384, help="headers: the header block's size")
    p.add_argument("--bytes-per-second", type=float, default=1e6, help="headers: the flood's rate")
    p.add_argument("--key", help="tokenizer: the tenant's key")
    p.add_argument("--chars", type=int, default=60000, help="tokenizer: characters per context")
    args = p.parse_args(argv)
    parsed = urlparse(args.url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    flood: _Flood
    if args.kind == "connections":
        flood = ConnectionFlood(host, port, args.connections, args.per_second)
    elif args.kind == "headers":
        flood = HeaderFlood(host, port, args.block_bytes, args.bytes_per_second)
    else:
        if not args.key:
            p.error("tokenizer needs --key")
        flood = TokenizerFlood(args.url, args.key, args.chars, args.per_second)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with flood:
        stop.wait(args.seconds)
    print(json.dumps(dict(flood.tally)), flush=True)
    return 0


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
