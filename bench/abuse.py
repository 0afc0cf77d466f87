"""The server under attack: well-behaved clients' latency with and without an adversary (loopback only).

    python -m bench.abuse --model DIR [--backend onnx] [--clients 32] [--seconds 30] [--json out.json]

Starts ``python -m server`` once and runs two bounded phases of ``--seconds`` each:
  1. ``baseline``: ``--clients`` well-behaved clients (closed loop, SQuAD sample questions);
  2. ``attack``: the same clients while ``--adversaries`` loops send, in turn, the largest context the
     character limit admits, a context of expanding Unicode (NFKD x18), a body over the byte limit,
     malformed bodies (invalid JSON, 400,000 batch items, 60,000 unknown fields), and big requests
     whose client disconnects after 50 ms, and heavy but admissible requests (a quarter of the largest
     context).
With ``--per-key`` the server has API keys: the well-behaved clients share ``--tenants`` keys, the
adversaries have one of their own, and every key is held to ``--key-max-inflight-windows`` and
``--key-windows-per-s`` (the adversaries' admissible requests should get 429, never 504). Beside them,
``--keyless`` loops send wrong keys from the tenants' own address (everyone is on loopback, as everyone
is behind an ingress), against the server's default failure budget: the tenants must never get 429
``too_many_auth_failures``.
Reports per phase: well-behaved requests, p50/p99 latency, 5xx responses (target 0), hangs (a request
without an answer within ``--hang-s``, target 0), the server's peak RSS, the largest response body,
and the ratio of the well-behaved p99 under attack to the baseline p99 (target <= 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.common import cpu_summary, percentile
from bench.flood_scenarios import FLOODS, flood_markdown, flood_row
from bench.serve_load import Outcome, closed_loop, load_pairs
from harness.server_process import ServerProcess
from qa_core.runtime.backends import SERVER_BACKENDS


@dataclass
class Phase:
    name: str
    seconds: float
    requests: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    errors_5xx: int = 0
    other_errors: int = 0
    hangs: int = 0
    adversary_requests: int = 0
    adversary_status: dict[str, int] = field(default_factory=dict)
    adversary_5xx: int = 0
    well_behaved_429: dict[str, int] = field(default_factory=dict)  # by error kind
    keyless_status: dict[str, int] = field(default_factory=dict)
    largest_response_bytes: int = 0
    peak_rss_mb: float = float("nan")


class Tally:
    """What one phase saw: latencies of well-behaved requests, statuses, sizes, hangs."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors_5xx = self.other_errors = self.hangs = 0
        self.adversary: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # well-behaved 429s by error kind
        self.keyless: Counter[str] = Counter()
        self.largest = 0

    def response(self, r: httpx.Response) -> None:
        self.largest = max(self.largest, len(r.content))


def peak_rss_mb(pid: int) -> float:
    """The process's resident-set high-water mark (Linux /proc), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


@dataclass(frozen=True)
class Keys:
    """With ``--per-key``: the well-behaved clients' tenants' keys and the adversaries' own key."""

    tenants: tuple[str, ...]
    adversary: str

    @classmethod
    def make(cls, tenants: int) -> Keys:
        return cls(tuple(secrets.token_urlsafe(24) for _ in range(tenants)), secrets.token_urlsafe(24))

    def file_text(self) -> str:
        lines = [f"tenant-{i}: {k}" for i, k in enumerate(self.tenants)] + [f"adversary: {self.adversary}"]
        return "\n".join(lines) + "\n"

    def tenant_headers(self, client: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tenants[client % len(self.tenants)]}"}


async def well_behaved(
    url: str, clients: int, seconds: float, hang_s: float, tally: Tally, pairs, keys: Keys | None = None
) -> None:
    def record(outcome: Outcome, latency: float) -> None:
        if isinstance(outcome, httpx.TimeoutException):
            tally.hangs += 1
        elif isinstance(outcome, httpx.HTTPError):
            tally.other_errors += 1
        else:
            tally.response(outcome)
            if outcome.status_code == 200:
                tally.latencies.append(latency)
            elif outcome.status_code >= 500:
                tally.errors_5xx += 1
            else:
                tally.other_errors += 1
                if outcome.status_code == 429:
                    tally.refused[error_kind(outcome)] += 1

    headers_of = keys.tenant_headers if keys else None
    await closed_loop(url, clients, seconds, pairs, record, timeout=hang_s, headers_of=headers_of)


def error_kind(r: httpx.Response) -> str:
    try:
        return str(r.json().get("error", "?"))
    except ValueError:
        return "?"


async def keyless_neighbour(url: str, loops: int, seconds: float, tally: Tally) -> None:
    """Wrong keys, one after another, from the tenants' address: a fresh random key each time."""
    deadline = time.perf_counter() + seconds

    async def loop(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            headers = {"Authorization": f"Bearer {secrets.token_urlsafe(24)}"}
            try:
                r = await client.post("/v1/answer", json={"question": "?", "context": "?"}, headers=headers)
            except httpx.HTTPError as exc:
                tally.keyless[type(exc).__name__] += 1
                continue
            tally.keyless[f"{r.status_code} {error_kind(r)}"] += 1

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(loop(client) for _ in range(loops)))


def attacks(
    limits: dict, pairs
) -> list[tuple[str, Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]]]:
    """(name, send) for every kind of hostile request, in the order the adversaries cycle through them."""
    paragraphs = " ".join(c for _, c in pairs)
    largest = (paragraphs * (1 + limits["max_context_chars"] // len(paragraphs)))[
        : limits["max_context_chars"]
    ]
    expanding = "\ufdfa" * limits["max_context_chars"]
    over = b'{"question": "a", "context": "' + b"x" * (limits["max_body_bytes"] + 1) + b'"}'
    many_items = b'{"items":[' + b",".join([b"1"] * 400_000) + b"]}"
    fields = ("{" + ",".join(f'"f{i}":1' for i in range(60_000)) + "}").encode()
    json_headers = {"content-type": "application/json"}

    def post(body: dict | None = None, raw: bytes | None = None, path: str = "/v1/answer", timeout=None):
        async def send(c: httpx.AsyncClient) -> httpx.Response:
            kw = {"timeout": timeout} if timeout is not None else {}
            if raw is not None:
                return await c.post(path, content=raw, headers=json_headers, **kw)
            return await c.post(path, json=body, **kw)

        return send

    return [
        ("max-size", post({"question": "What happened?", "context": largest})),
        ("heavy", post({"question": "What happened?", "context": largest[: len(largest) // 4]})),
        ("expanding-unicode", post({"question": "What?", "context": expanding})),
        ("oversized-body", post(raw=over)),
        ("invalid-json", post(raw=b'{"question": "a", "context": ')),
        ("400k-items", post(raw=many_items, path="/v1/answer/batch")),
        ("60k-unknown-fields", post(raw=fields)),
        ("disconnect", post({"question": "What happened?", "context": largest}, timeout=0.05)),
    ]


async def adversary(
    url: str, loops: int, seconds: float, tally: Tally, limits: dict, pairs, keys: Keys | None = None
) -> None:
    kinds = attacks(limits, pairs)
    deadline = time.perf_counter() + seconds

    async def loop(i: int, client: httpx.AsyncClient) -> None:
        k = i
        while time.perf_counter() < deadline:
            name, send = kinds[k % len(kinds)]
            k += 1
            try:
                r = await send(client)
            except httpx.TimeoutException:
                tally.adversary[f"{name}: client gave up"] += 1
                continue
            except httpx.HTTPError as exc:
                tally.adversary[f"{name}: {type(exc).__name__}"] += 1
                continue
            tally.response(r)
            tally.adversary[f"{name}: {r.status_code}"] += 1

    headers = {"Authorization": f"Bearer {keys.adversary}"} if keys else None
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as client:
        await asyncio.gather(*(loop(i, client) for i in range(loops)))


def run_phase(
    name: str, server: ServerProcess, args: argparse.Namespace, limits: dict, pairs, keys: Keys | None = None
) -> Phase:
    tally = Tally()

    async def both() -> None:
        jobs = [well_behaved(server.url, args.clients, args.seconds, args.hang_s, tally, pairs, keys)]
        if name == "attack":
            jobs.append(adversary(server.url, args.adversaries, args.seconds, tally, limits, pairs, keys))
            if keys is not None and args.keyless:
                jobs.append(keyless_neighbour(server.url, args.keyless, args.seconds, tally))
        await asyncio.gather(*jobs)

    start = time.perf_counter()
    asyncio.run(both())
    elapsed = time.perf_counter() - start
    phase = Phase(name, round(elapsed, 1), len(tally.latencies))
    phase.p50_ms = percentile(tally.latencies, 50) * 1000
    phase.p99_ms = percentile(tally.latencies, 99) * 1000
    phase.errors_5xx, phase.other_errors, phase.hangs = tally.errors_5xx, tally.other_errors, tally.hangs
    phase.adversary_requests = sum(tally.adversary.values())
    phase.adversary_status = dict(sorted(tally.adversary.items()))
    phase.adversary_5xx = sum(n for k, n in tally.adversary.items() if k.split(": ")[1][:1] == "5")
    phase.well_behaved_429 = dict(sorted(tally.refused.items()))
    phase.keyless_status = dict(sorted(tally.keyless.items()))
    phase.largest_response_bytes = tally.largest
    phase.peak_rss_mb = peak_rss_mb(server.proc.pid)
    return phase


def markdown(phases: Sequence[Phase], title: str) -> str:
    lines = [
        f"**{title}**",
        "",
        "| phase | well-behaved requests | p50 ms | p99 ms | 5xx | hangs | other errors | adversary requests "
        "| adversary 5xx | largest response (bytes) | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        lines.append(
            f"| {p.name} | {p.requests} | {p.p50_ms:.1f} | {p.p99_ms:.1f} | {p.errors_5xx} | {p.hangs} | "
            f"{p.other_errors} | {p.adversary_requests} | {p.adversary_5xx} | {p.largest_response_bytes} | "
            f"{p.peak_rss_mb:.0f} |"
        )
    base, attack = phases[0], phases[-1]
    lines += [
        "",
        f"Well-behaved p99 under attack / without: **{attack.p99_ms / base.p99_ms:.2f}x** (target <= 3).",
    ]
    if attack.adversary_status:
        lines += [
            "",
            "Adversary responses: " + ", ".join(f"{k} x{n}" for k, n in attack.adversary_status.items()),
        ]
    if attack.keyless_status:
        lines += [
            "",
            "Keyless neighbour's responses: "
            + ", ".join(f"{k} x{n}" for k, n in attack.keyless_status.items()),
        ]
    for p in phases:
        refused = ", ".join(f"{k} x{n}" for k, n in p.well_behaved_429.items()) or "none"
        lines += ["", f"Well-behaved 429s in {p.name}, by kind: {refused}."]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.abuse", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="export dir (onnx/trt) or checkpoint dir (torch)")
    p.add_argument("--backend", default="onnx", choices=SERVER_BACKENDS)
    p.add_argument("--clients", type=int, default=32, help="well-behaved concurrent clients")
    p.add_argument("--adversaries", type=int, default=4, help="concurrent hostile loops")
    p.add_argument("--seconds", type=float, default=30.0, help="measured seconds per phase")
    p.add_argument("--threads", type=int, default=1, help="backend intra-op threads")
    p.add_argument(
        "--hang-s", type=float, default=30.0, help="a request without an answer this long is a hang"
    )
    p.add_argument(
        "--per-key",
        action="store_true",
        help="API keys on: the well-behaved clients spread over --tenants keys, the adversaries on a key of "
        "their own, every key under --key-max-inflight-windows and --key-windows-per-s",
    )
    p.add_argument("--tenants", type=int, default=4, help="with --per-key: well-behaved keys")
    p.add_argument(
        "--keyless",
        type=int,
        default=1,
        help="with --per-key: loops sending wrong keys from the tenants' address during the attack",
    )
    p.add_argument("--key-max-inflight-windows", type=int, default=16)
    p.add_argument("--key-windows-per-s", type=float, default=40.0)
    p.add_argument("--key-requests-per-s", type=float, default=None, help="with --per-key (default: none)")
    p.add_argument(
        "--flood",
        choices=(*FLOODS, "all"),
        help="instead of the phases: one flood (or all) beside a key holder, each against a fresh server "
        "(bench.floods): idle keyless connections (HTTP, TLS), keyless header blocks, a tenant's "
        "tokenized-then-refused contexts",
    )
    p.add_argument(
        "--requests", type=int, default=60, help="with --flood: the key holder's requests per phase"
    )
    p.add_argument("--repo", type=Path, help='with --flood: another checkout\'s server (a "before")')
    p.add_argument("--server-python", help="with --flood: that checkout's interpreter")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--log-dir", type=Path, default=Path("/tmp"), help="where the server's log goes")
    args = p.parse_args(argv)
    if not 0 < args.seconds <= 600:
        p.error("--seconds must be in (0, 600] (the benchmark is bounded)")
    if not 1 <= args.clients <= 256 or not 0 <= args.adversaries <= 64 or not 0 <= args.keyless <= 64:
        p.error("--clients must be in 1..256, --adversaries and --keyless in 0..64")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.flood:
        return run_floods(args)
    pairs = load_pairs()
    flags: tuple[str, ...] = ("--threads", str(args.threads))
    keys = Keys.make(args.tenants) if args.per_key else None
    if keys is not None:
        keys_file = args.log_dir / "abuse-keys.txt"
        keys_file.write_text(keys.file_text())
        keys_file.chmod(0o600)
        flags += ("--api-keys-file", str(keys_file))  # the default failure budget: the neighbour spends it
        flags += ("--key-max-inflight-windows", str(args.key_max_inflight_windows))
        flags += ("--key-windows-per-s", str(args.key_windows_per_s))
        if args.key_requests_per_s is not None:
            flags += ("--key-requests-per-s", str(args.key_requests_per_s))
    log_path = args.log_dir / "abuse-server.log"
    server = ServerProcess(args.model, *flags, backend=args.backend, log_path=log_path)
    try:
        server.launch()
        server.wait()
        auth = keys.tenant_headers(0) if keys else None
        limits = httpx.get(server.url + "/v1/model", headers=auth).json()["limits"]
        phases = []
        for name in ("baseline", "attack"):
            phases.append(run_phase(name, server, args, limits, pairs, keys))
            print(f"  {name}: {phases[-1].requests} well-behaved requests", file=sys.stderr)
    finally:
        server.stop()
    title = f"{args.backend} backend, {args.threads} intra-op thread(s), {args.clients} clients, "
    title += f"{args.adversaries} adversaries, {args.seconds:g} s per phase"
    if keys is not None:
        title += (
            f"; API keys: well-behaved clients on {args.tenants} keys, adversaries on their own, each key "
            f"<= {args.key_max_inflight_windows} windows in flight and {args.key_windows_per_s:g} windows/s"
        )
        if args.keyless:
            title += f"; {args.keyless} keyless loop(s) sending wrong keys from the tenants' address"
        if args.key_requests_per_s is not None:
            title += f" and {args.key_requests_per_s:g} requests/s"
    title += f"; {cpu_summary()}"
    print(markdown(phases, title))
    if args.json:
        args.json.write_text(json.dumps({"title": title, "phases": [asdict(p) for p in phases]}, indent=2))
    return 0


def run_floods(args: argparse.Namespace) -> int:
    names = FLOODS if args.flood == "all" else (args.flood,)
    rows = []
    for name in names:
        rows.append(
            flood_row(
                name, args.model, args.backend, args.log_dir, args.requests, args.repo, args.server_python
            )
        )
        print(f"  {name}: {rows[-1]['flooded']['success']:.0%} served under the flood", file=sys.stderr)
    served_by = f", server from {args.repo}" if args.repo else ""
    title = f"Floods beside a key holder ({args.requests} requests each, new connections){served_by}; {cpu_summary()}"
    print(flood_markdown(rows, title))
    if args.json:
        args.json.write_text(json.dumps({"title": title, "floods": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
