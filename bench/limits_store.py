"""A ``--limits-redis`` store that fails under load, beside the service: what ``python -m bench.limits_store``
reports and tests/test_limits_store_failures.py asserts.

    python -m bench.limits_store --model DIR [--repo OLD --server-python PY] [--json out.json]

Each scenario runs against a fresh ``redis-server`` and a fresh server (one process, then
``--engine-process``) with a key whose limits are kept in that Redis: six clients ask as fast as they
are answered (:class:`Load`, one keep-alive connection each) and a keyless probe asks ``/healthz`` every
50 ms; after ``--warm-s`` the store fails for ``--fail-s`` seconds, then heals:

- ``paused``: SIGSTOP (connections stay open, nothing answers: a stalled host, a long fork);
- ``read-only``: a replica of a primary that is not there (every write refused: READONLY, a failover);
- ``out-of-memory``: ``maxmemory 1``, no eviction (every write refused: OOM).

Per phase (before the failure, during it): answers per second, the key holder's p50 and p99, the probe's
p99, and every status seen. With ``--repo``, the server is another checkout's (a "before"; Redis then
listens on TCP, which servers before unix:// sockets need).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.common import BackgroundThreads, cpu_summary, percentile
from harness.redis_store import RedisStore
from harness.server_process import ServerProcess

KEY = "limits-store-key-0123456789abcdef"
OK = {"question": "What happened?", "context": "Something happened here."}
FAILURES: dict[str, tuple[Callable[[RedisStore], None], Callable[[RedisStore], None]]] = {
    "paused": (RedisStore.pause, RedisStore.resume),
    "read-only": (RedisStore.read_only, RedisStore.writable),
    "out-of-memory": (RedisStore.out_of_memory, RedisStore.writable),
}
MODES = {"one process": (), "engine process": ("--engine-process",)}


class Load(BackgroundThreads):
    """``clients`` keyed clients asking as fast as answered, and one keyless ``/healthz`` probe every
    50 ms (as a kubelet, only faster); each outcome is timed: (seconds since start, status, latency)."""

    def __init__(self, url: str, key: str, clients: int = 6) -> None:
        super().__init__([self._ask] * clients + [self._probe])
        self.url, self.key, self.t0 = url, key, time.monotonic()
        self.answers: list[tuple[float, str, float]] = []
        self.probes: list[tuple[float, str, float]] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _timed(self, client: httpx.Client, into: list, method: str, path: str, **kw: Any) -> None:
        start = time.monotonic()
        try:
            outcome = str(client.request(method, path, **kw).status_code)
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        into.append((start - self.t0, outcome, time.monotonic() - start))

    def _ask(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.url, timeout=30, headers=headers) as c:
            while not self.stopping.is_set():
                self._timed(c, self.answers, "POST", "/v1/answer", json=OK)

    def _probe(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.stopping.is_set():
                self._timed(c, self.probes, "GET", "/healthz")
                time.sleep(0.05)

    @staticmethod
    def between(outcomes: list[tuple[float, str, float]], a: float, b: float) -> list[tuple[str, float]]:
        """(status, latency) of what started in ``[a, b)``."""
        return [(o, t) for start, o, t in outcomes if a <= start < b]


def phase(load: Load, a: float, b: float) -> dict[str, Any]:
    answers, probes = load.between(load.answers, a, b), load.between(load.probes, a, b)
    ok = [t * 1000 for o, t in answers if o == "200"]
    return {
        "answers_per_s": len(answers) / (b - a),
        "p50_ms": percentile(ok, 50) if ok else float("nan"),
        "p99_ms": percentile(ok, 99) if ok else float("nan"),
        "probe_p99_ms": percentile([t * 1000 for _, t in probes], 99) if probes else float("nan"),
        "statuses": dict(Counter(o for o, _ in answers)),
        "probe_statuses": dict(Counter(o for o, _ in probes)),
    }


def scenario(
    failure: str, mode: str, model: str | Path, work: Path, warm_s: float, fail_s: float,
    repo: Path | None = None, python: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One failure in one mode: the two phases, and whether the server was still up at the end."""
    fail, heal = FAILURES[failure]
    work.mkdir(parents=True, exist_ok=True)
    keys = work / "keys.txt"
    keys.write_text(f"tenant: {KEY}\n")
    keys.chmod(0o600)
    with RedisStore(tcp=repo is not None) as store:
        flags = ["--api-keys-file", str(keys), "--key-requests-per-s", "5000", "--limits-redis", store.url]
        server = ServerProcess(
            model, *flags, *MODES[mode], "--access-log", "false", repo=repo, python=python,
            log_path=work / f"{failure}-{mode.replace(' ', '-')}.log",
        )  # fmt: skip
        with server, Load(server.url, KEY) as load:
            time.sleep(warm_s)
            failed_at = load.now()
            fail(store)
            time.sleep(fail_s)
            heal(store)
            time.sleep(0.5)
            up = server.proc is not None and server.proc.poll() is None
    return {
        "failure": failure,
        "mode": mode,
        "before": phase(load, 1.0, failed_at),
        "during": phase(load, failed_at, failed_at + fail_s),
        "server_up_after": up,
    }


def markdown(rows: Sequence[dict[str, Any]], title: str) -> str:
    lines = [f"**{title}**", "", "| store | server | answers/s before → during | key holder p50 ms | probe p99 ms | "
             "statuses during | up after |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        b, d = r["before"], r["during"]
        lines.append(
            f"| {r['failure']} | {r['mode']} | {b['answers_per_s']:.0f} → {d['answers_per_s']:.1f} | "
            f"{b['p50_ms']:.1f} → {d['p50_ms']:.1f} | {b['probe_p99_ms']:.1f} → {d['probe_p99_ms']:.1f} | "
            f"{d['statuses']} | {'yes' if r['server_up_after'] else '**no**'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.limits_store", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="export directory")
    p.add_argument("--failure", choices=[*FAILURES, "all"], default="all")
    p.add_argument("--warm-s", type=float, default=3.0, help="load before the store fails")
    p.add_argument("--fail-s", type=float, default=6.0, help="how long it fails")
    p.add_argument("--repo", type=Path, help='another checkout\'s server (a "before")')
    p.add_argument("--server-python", help="that checkout's interpreter")
    p.add_argument("--work", type=Path, default=Path("runs/bench-limits-store"))
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    failures = list(FAILURES) if args.failure == "all" else [args.failure]
    rows = []
    for failure in failures:
        for mode in MODES:
            rows.append(scenario(failure, mode, args.model, args.work, args.warm_s, args.fail_s, args.repo,
                                 args.server_python))  # fmt: skip
            print(
                f"  {failure}, {mode}: {rows[-1]['during']['answers_per_s']:.1f} answers/s", file=sys.stderr
            )
    served_by = f", server from {args.repo}" if args.repo else ""
    title = f"A limits store failing under load ({args.fail_s:g} s){served_by}; {cpu_summary()}"
    print(markdown(rows, title))
    if args.json:
        args.json.write_text(json.dumps({"title": title, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
