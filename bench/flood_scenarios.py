"""The floods' scenarios, the one home ``bench.abuse --flood`` and the attack tests read: each flood's
server flags, its flooder's arguments, and the key holder measured beside it (:func:`key_holder`
sends ``n`` requests one after another, each on a new connection, and returns (status or error name,
seconds) for each); :func:`flood_row` runs one against a fresh server and reports both phases.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.floods import flood_process


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
                outcome = str(client.post("/v1/answer", json=body, headers=headers).status_code)
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        out.append((outcome, time.perf_counter() - start))
    return out


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


FLOODS = (
    "connections", "connections-tls", "headers-16k", "headers-100k", "tokenizer",
    "key-probes", "key-requests", "key-probes-thousands", "lingering", "metrics-port", "batches",
)  # fmt: skip
KEY_A, KEY_B = "flood-tenant-key-0123456789abcdef", "key-holder-key-fedcba9876543210"
SHIPPED_MODEL_FLOODS = ("tokenizer", "batches")  # floods whose cost is the real model's (tests use it)


@dataclass(frozen=True)
class FloodSetup:
    """One flood's scenario: the server's flags beyond its keys file, the key holder's request (None: a
    short question) and, under TLS, the CA its clients trust."""

    name: str
    flags: tuple[str, ...]
    body: dict[str, str] | None
    ca: Path | None
    settle_s: float = 3.0  # the flood's head start before the key holder is measured beside it

    def flood(self, url: str, port: int, tenant_key: str, metrics_port: int | None = None) -> tuple[str, ...]:
        """:func:`flood_process`'s arguments against the server at ``url`` (``port``; its metrics on
        ``metrics_port``): a connection flood never speaks, so it gets plain TCP, TLS or not; the
        tenant's floods are ``tenant_key``'s."""
        name, plain = self.name, f"http://127.0.0.1:{port}"
        if name.startswith("connections"):
            return ("connections", plain, "--connections", "300", "--per-second", "200")
        if name.startswith("headers-"):
            block = {"headers-16k": 16 * 1024, "headers-100k": 100 * 1024}[name]
            return ("headers", url, "--block-bytes", str(block), "--bytes-per-second", "1000000")
        if name in ("key-probes", "key-requests"):
            path = "/healthz" if name == "key-probes" else "/v1/model"
            return ("key-connections", plain, "--key", tenant_key, "--connections", "300", "--per-second", "200",
                    "--path", path)  # fmt: skip
        if name == "key-probes-thousands":
            return (
                "key-connections",
                plain,
                "--key",
                tenant_key,
                "--connections",
                "2200",
                "--per-second",
                "1000",
            )
        if name == "lingering":
            return ("lingering", plain, "--addresses", "16", "--per-second", "300")
        if name == "metrics-port":
            assert metrics_port is not None, "the metrics flood needs the server's metrics port"
            return (
                "metrics",
                f"http://127.0.0.1:{metrics_port}",
                "--half-open",
                "2000",
                "--per-second",
                "400",
            )
        if name == "batches":
            return ("batches", url, "--key", tenant_key, "--concurrency", "16", "--chars", "20000")
        return ("tokenizer", url, "--key", tenant_key, "--chars", "60000", "--per-second", "20")


def flood_setup(name: str, work: Path, metrics_port: int = 0) -> FloodSetup:
    """The scenario of flood ``name`` (one of :data:`FLOODS`); TLS certificates are written under ``work``.

    - connections: ``--max-connections 150``, a 3 s header deadline, and a flood of 300 idle connections;
    - headers: the default caps, ~1 MB/s of 16 KB or 100 KB header blocks;
    - tokenizer: the README's example limits per key, at most 64 windows a request (a 60,000-character
      context is ~110), and the key holder's long question on the featurize thread;
    - key-probes, key-requests: ``--max-connections 150``, and one valid key holding 300 keep-alive
      connections, each asking ``/healthz`` (or ``/v1/model``) every 3.5 s; key-probes-thousands: the same
      with the default limits (2,112 connections) and 2,600 of them (the server needs a limit of open
      files above that);
    - lingering: ``--max-connections 150``, and 300 keyless requests a second from 16 addresses, each
      declaring a body of 1,000,000 bytes and sending none;
    - metrics-port: the metrics on a port of their own (``metrics_port``, 0: any free one, read from the
      log), 6,000 half-sent requests held there and 2,000 scrapes a second;
    - batches: the default limits, one key keeping 16 batches of 2 x 20,000 characters in flight, and the
      key holder asking a sample question about its paragraph.
    """
    if name not in FLOODS:
        raise ValueError(f"unknown flood {name!r}; one of {', '.join(FLOODS)}")
    crowded = ("--max-connections", "150", "--header-timeout-s", "3")
    if name.startswith("connections"):
        if not name.endswith("tls"):
            return FloodSetup(name, crowded, None, None)
        from harness.certificates import make_certificates

        ca, cert, key = make_certificates(work)
        return FloodSetup(name, (*crowded, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)), None, ca)
    if name in ("key-probes", "key-requests", "lingering"):
        return FloodSetup(name, crowded, None, None)
    if name == "key-probes-thousands":
        return FloodSetup(name, (), None, None, settle_s=10.0)  # thousands take a while to open
    if name == "metrics-port":
        return FloodSetup(name, ("--metrics-port", str(metrics_port)), None, None)
    if name.startswith("headers-"):
        return FloodSetup(name, (), None, None)
    if name == "batches":
        return FloodSetup(name, (), sample_question(), None)
    limits = ("--key-requests-per-s", "20", "--key-windows-per-s", "200", "--key-max-inflight-windows", "256")
    words = "The committee reviewed the annual report and approved the budget for next year. "
    body = {"question": "What was approved?", "context": (words * 30)[:2400]}
    return FloodSetup(name, (*limits, "--max-request-windows", "64"), body, None)


def sample_question() -> dict[str, str]:
    """The sample's first question about its whole paragraph (two windows of the shipped model): a
    tenant's typical request, as ``bench.serve`` asks them, beside another tenant's flood."""
    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "sample" / "dev.json").read_text())
    paragraph = data["data"][0]["paragraphs"][0]
    return {"question": paragraph["qas"][0]["question"], "context": paragraph["context"]}


METRICS_LINE = re.compile(r"metrics on http://[^:]+:(\d+)/metrics")


def metrics_port_of(log: str) -> int:
    """The metrics port a server logged last (``--metrics-port 0`` picks a free one; a log file may hold
    earlier runs too)."""
    found = METRICS_LINE.findall(log)
    if not found:
        raise RuntimeError(f"the server logged no metrics port:\n{log[-2000:]}")
    return int(found[-1])


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
    from harness.server_process import ServerProcess, free_port

    work.mkdir(parents=True, exist_ok=True)
    keys = work / "flood-keys.txt"
    keys.write_text(f"tenant: {KEY_A}\nholder: {KEY_B}\n")
    keys.chmod(0o600)
    setup = flood_setup(name, work, metrics_port=free_port() if repo else 0)  # an older server: no port 0
    server = ServerProcess(
        model, "--api-keys-file", str(keys), *setup.flags, backend=backend, repo=repo, python=python,
        tls_ca=setup.ca, log_path=work / f"flood-{name}.log",
        log_level="info" if name == "metrics-port" else "warning",  # the port is on the info line
    )  # fmt: skip
    with server:
        metrics = metrics_port_of(server.log()) if name == "metrics-port" else None
        unloaded = key_holder(server.url, KEY_B, requests, ca=setup.ca, body=setup.body)
        with flood_process(*setup.flood(server.url, server.port, KEY_A, metrics)) as flood:
            time.sleep(setup.settle_s)
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
