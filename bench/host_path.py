"""Where a request's time goes on the host: the server's own stages, what lies outside them, and the
floor FastAPI + uvicorn set on this machine.

The server reports its stages in a ``Server-Timing`` header (``parse;dur=0.041, auth;dur=0.003, ...``,
milliseconds; :mod:`server.observability.timing`); a build that predates the header reports only the handler's
stages in the body's ``timing_ms``, read here under the same names (``inference`` is ``engine``).
One client sends requests one at a time; per stage the table gives the median, then the server's
total, the rest of the round trip (HTTP parsing, the loopback and this client) and the end-to-end
latency. The echo floor is :mod:`bench.echo_app` under the same client in the same run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from bench.http_load import Reply, encode_post, one_at_a_time, run_async
from harness.server_process import LOOPBACK, REPO, child_env, free_port

STAGES = ("parse", "auth", "featurize", "queue", "engine", "decode", "serialize")
_BODY_NAMES = {"featurize": "featurize", "queue": "queue", "inference": "engine", "decode": "decode"}


def server_timing(header: str) -> dict[str, float]:
    """``name;dur=1.5, other;dur=0.2`` -> ``{"name": 1.5, "other": 0.2}`` (entries without dur skipped)."""
    out: dict[str, float] = {}
    for entry in header.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "dur" and name:
                with suppress(ValueError):
                    out[name] = float(value)
    return out


def reply_stages(reply: Reply) -> dict[str, float]:
    """The stages a reply reports (ms): its Server-Timing header, else its body's ``timing_ms``."""
    header = reply.headers.get("server-timing")
    if header:
        return server_timing(header)
    try:
        timing = json.loads(reply.body).get("timing_ms") or {}
    except (ValueError, AttributeError):
        return {}
    out = {new: float(timing[old]) for old, new in _BODY_NAMES.items() if old in timing}
    if "total" in timing:
        out["handler"] = float(timing["total"])
    return out


@dataclass
class StageTable:
    """Medians over the requests of one-at-a-time run (ms); stages a build does not report are absent."""

    requests: int
    stages: dict[str, float] = field(default_factory=dict)
    server_total: float | None = None  # Server-Timing "total": first byte of the app to response start
    end_to_end: float = 0.0
    outside_server: float | None = None  # end to end minus the server total, request by request

    def rows(self) -> list[tuple[str, str]]:
        def ms(v: float | None) -> str:
            return "not reported" if v is None else f"{v:.3f}"

        rows = [(name, ms(self.stages.get(name))) for name in STAGES]
        if "handler" in self.stages:
            rows.append(("handler (body timing_ms total)", ms(self.stages["handler"])))
        rows.append(("server total (Server-Timing)", ms(self.server_total)))
        rows.append(("outside the server: HTTP parse, loopback, client", ms(self.outside_server)))
        rows.append(("end to end", ms(self.end_to_end)))
        return rows


def stage_table(samples: Sequence[tuple[Reply, float]]) -> StageTable:
    ok = [(r, s) for r, s in samples if r.status == 200]
    if not ok:
        raise RuntimeError(f"no request succeeded ({[r.status for r, _ in samples][:5]} ...)")
    per = [reply_stages(r) for r, _ in ok]
    names = {k for p in per for k in p}
    stages = {k: statistics.median(p[k] for p in per if k in p) for k in names if k != "total"}
    latency_ms = [s * 1000 for _, s in ok]
    table = StageTable(len(ok), stages, end_to_end=statistics.median(latency_ms))
    totals = [p.get("total") for p in per]
    if all(t is not None for t in totals):
        table.server_total = statistics.median(t for t in totals if t is not None)
        table.outside_server = statistics.median(
            lat - t for lat, t in zip(latency_ms, totals, strict=True) if t is not None
        )
    return table


def answer_bodies(pairs: Sequence[tuple[str, str]]) -> list[bytes]:
    return [json.dumps({"question": q, "context": c}).encode() for q, c in pairs]


def encoded_requests(
    port: int, bodies: Sequence[bytes], headers: dict[str, str] | None = None
) -> list[bytes]:
    return [encode_post(LOOPBACK, port, "/v1/answer", b, headers) for b in bodies]


def measure_stages(port: int, bodies: Sequence[bytes], headers: dict[str, str] | None = None) -> StageTable:
    """One client, one request at a time, every body once."""
    samples = run_async(one_at_a_time(LOOPBACK, port, encoded_requests(port, bodies, headers)))
    return stage_table(samples)


@contextmanager
def echo_server(log_dir: Path, http: str = "auto", loop: str = "auto") -> Iterator[int]:
    """:mod:`bench.echo_app` on a free loopback port for the duration (yields the port)."""
    import time

    import httpx

    port = free_port()
    log = (log_dir / f"echo-{http}-{loop}.log").open("ab")
    cmd = [sys.executable, "-m", "bench.echo_app", "--port", str(port), "--http", http, "--loop", loop]
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the echo server exited with {proc.returncode} (see {log.name})")
            try:
                if httpx.get(f"http://{LOOPBACK}:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the echo server did not start within 30 s") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
