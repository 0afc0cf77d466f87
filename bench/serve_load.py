"""Bounded HTTP load test of the QA server, with and without micro-batching (loopback only).

    python -m bench.serve_load --model DIR --backend onnx --clients 1,4,16 --seconds 10
    python -m bench.serve_load --url http://127.0.0.1:8000 --clients 8 --seconds 5

N concurrent clients (asyncio + httpx, closed loop: each sends its next request when the previous one
returns) post SQuAD dev questions to ``/v1/answer`` for T seconds after a short warm-up. With ``--model``
the script starts ``python -m server`` itself once per mode: ``batched`` (max_batch_size/delay as
given) and ``unbatched`` (max_batch_size 1, delay 0). Prints a Markdown table: throughput, p50/p99
latency, errors and the mean number of windows per backend call (read from ``/metrics``).

Client and server share the machine, so on few cores the client's own CPU use lowers the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

from bench.common import markdown_table, percentile
from bench.host_path import answer_bodies
from bench.http_load import closed_loop as lean_closed_loop
from bench.http_load import encode_post, run_async
from bench.process_cpu import cpu_seconds_by_role
from harness.server_process import ServerProcess
from qa_core.runtime.backends import SERVER_BACKENDS
from server.observability.metrics import sample_total
from train.common.sample_data import SAMPLE_DEV

REPO = Path(__file__).resolve().parents[1]
DEV = SAMPLE_DEV
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MODES = {"batched": None, "unbatched": ("--max-batch-size", "1", "--max-batch-delay-ms", "0")}
FRONTS = "fronts="  # mode "fronts=N": batched, N front processes over one engine process


@dataclass
class Result:
    mode: str
    clients: int
    seconds: float
    requests: int
    errors: int
    throughput: float
    p50_ms: float
    p99_ms: float
    windows_per_call: float
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)  # by process role (bench.process_cpu)


def load_pairs(path: Path = DEV) -> list[tuple[str, str]]:
    data = json.loads(path.read_text())
    return [(qa["question"], p["context"]) for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]]


Outcome = httpx.Response | httpx.HTTPError


async def closed_loop(
    url: str,
    clients: int,
    seconds: float,
    pairs: list[tuple[str, str]],
    record: Callable[[Outcome, float], None],
    timeout: float = 60,
    headers_of: Callable[[int], dict[str, str]] | None = None,
) -> None:
    """``clients`` closed-loop clients post ``pairs`` to ``/v1/answer`` for ``seconds``; every request's
    outcome (response or transport error) and latency go to ``record``. ``headers_of(i)``: client
    ``i``'s own headers (its API key)."""
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def worker(i: int, client: httpx.AsyncClient) -> None:
        k = i * 7
        while time.perf_counter() < deadline:
            question, context = pairs[k % len(pairs)]
            k += 1
            start = time.perf_counter()
            outcome: Outcome
            try:
                outcome = await client.post(
                    "/v1/answer",
                    json={"question": question, "context": context},
                    headers=headers_of(i) if headers_of else None,
                )
            except httpx.HTTPError as exc:
                outcome = exc
            record(outcome, time.perf_counter() - start)

    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        await asyncio.gather(*(worker(i, client) for i in range(clients)))


def measure(
    url: str, mode: str, clients: int, seconds: float, warmup: float, pairs, pid: int | None = None
) -> Result:
    """``clients`` closed-loop clients (:mod:`bench.http_load`) for ``seconds`` after ``warmup``;
    windows per backend call from the server's ``/metrics`` (NaN for a server without them); with the
    server's ``pid``, the CPU its processes spent per answered request, by role."""
    parsed = urlparse(url)
    if parsed.scheme != "http" or parsed.hostname is None or parsed.port is None:
        raise ValueError(f"the load client speaks plain HTTP to host:port, not {url!r}")
    host, port = parsed.hostname, parsed.port
    requests = [encode_post(host, port, "/v1/answer", body) for body in answer_bodies(pairs)]
    if warmup > 0:
        run_async(lean_closed_loop(host, port, requests, clients, warmup))
    before = _metrics_text(url)
    cpu_before = cpu_seconds_by_role(pid) if pid else {}
    load = run_async(lean_closed_loop(host, port, requests, clients, seconds))
    cpu_after = cpu_seconds_by_role(pid) if pid else {}
    after = _metrics_text(url)
    answered = max(1, len(load.latencies))
    cpu = {role: 1000 * (cpu_after[role] - cpu_before.get(role, 0.0)) / answered for role in cpu_after}
    windows = sample_total(after, "xlnetqa_batch_size_sum") - sample_total(before, "xlnetqa_batch_size_sum")
    calls = sample_total(after, "xlnetqa_batch_size_count") - sample_total(before, "xlnetqa_batch_size_count")
    return Result(
        mode=mode,
        clients=clients,
        seconds=round(load.seconds, 2),
        requests=len(load.latencies),
        errors=load.errors,
        throughput=len(load.latencies) / load.seconds,
        p50_ms=percentile(load.latencies, 50) * 1000,
        p99_ms=percentile(load.latencies, 99) * 1000,
        windows_per_call=windows / calls if calls else float("nan"),
        cpu_ms_per_request={role: round(ms, 3) for role, ms in sorted(cpu.items())},
    )


def _metrics_text(url: str) -> str:
    response = httpx.get(url + "/metrics")
    return response.text if response.status_code == 200 else ""


def markdown(results: Sequence[Result], title: str) -> str:
    header = ["batching", "clients", "requests", "req/s", "p50 ms", "p99 ms", "errors", "windows/call",
              "CPU ms/request by process"]  # fmt: skip
    rows = [
        [r.mode, r.clients, r.requests, f"{r.throughput:.1f}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}", r.errors,
         f"{r.windows_per_call:.2f}", " ".join(f"{k} {v:.2f}" for k, v in r.cpu_ms_per_request.items()) or "-"]
        for r in results
    ]  # fmt: skip
    return f"**{title}**\n\n" + markdown_table(header, rows)


def _check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host not in LOOPBACK:
        raise SystemExit(f"error: --url must point at this machine (127.0.0.1/localhost), got {host!r}")


def add_load_arguments(p: argparse.ArgumentParser, clients: str) -> None:
    """The load-test options bench.serve_load and bench.serve share."""
    p.add_argument("--backend", default="onnx", choices=SERVER_BACKENDS)
    p.add_argument("--clients", default=clients, help="comma-separated concurrency levels")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each level")
    p.add_argument("--modes", default="batched,unbatched", help="batched and/or unbatched")
    p.add_argument("--threads", type=int, default=1, help="backend intra-op threads")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-batch-delay-ms", type=float, default=2.0)
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--log-dir", type=Path, default=Path("/tmp"), help="where the servers' logs go")
    p.add_argument(
        "--repo",
        type=Path,
        help="serve from this checkout instead (another commit's server, measured by this client)",
    )
    p.add_argument(
        "--server-python",
        help="the interpreter the servers run under (e.g. a venv with --repo's own dependencies)",
    )
    p.add_argument(
        "--server-args",
        default="",
        help="more `python -m server` flags for every server started, one string "
        "(--server-args='--torch-device cuda --torch-dtype fp16 --torch-cuda-graphs')",
    )


def check_load_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject bad load options with a usage error; sets ``args.levels`` and ``args.mode_list``."""
    if not 0 < args.seconds <= 600:
        p.error("--seconds must be in (0, 600] (the load test is bounded)")
    try:
        args.levels = [int(x) for x in args.clients.split(",") if x.strip()]
    except ValueError:
        p.error(f"--clients must be comma-separated integers, got {args.clients!r}")
    if not args.levels or min(args.levels) < 1 or max(args.levels) > 256:
        p.error("--clients must be integers in 1..256")
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.mode_list if m not in MODES and not _fronts(m)]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; choose from {sorted(MODES)} or {FRONTS}N (N >= 1)")
    if args.repo is not None and not (args.repo / "server" / "__main__.py").is_file():
        p.error(f"--repo {args.repo} is not a checkout of this project")


def _fronts(mode: str) -> int | None:
    """N of a ``fronts=N`` mode (None for any other mode or a bad N)."""
    if not mode.startswith(FRONTS):
        return None
    n = mode[len(FRONTS) :]
    return int(n) if n.isdigit() and int(n) >= 1 else None


def server_flags(args: argparse.Namespace, mode: str) -> tuple[str, ...]:
    """``python -m server`` flags for one mode: batching as given (batched) or off (unbatched)."""
    batched = (
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-batch-delay-ms",
        str(args.max_batch_delay_ms),
    )
    extra = shlex.split(getattr(args, "server_args", "") or "")
    n = _fronts(mode)
    fronts = ("--workers", str(n), "--engine-process", "true") if n else ()
    own = batched if n else (MODES[mode] or batched)
    return (*own, *fronts, "--threads", str(args.threads), "--max-queue", "1024", *extra)


def run_modes(
    args: argparse.Namespace,
    pairs: list[tuple[str, str]],
    log_prefix: str,
    on_ready: Callable[[str, ServerProcess], None] | None = None,
) -> list[Result]:
    """Start a server per mode, call ``on_ready(mode, server)``, then measure every client level."""
    results: list[Result] = []
    for mode in args.mode_list:
        log_path = args.log_dir / f"{log_prefix}-{mode.replace('=', '')}.log"
        server = ServerProcess(
            args.model, *server_flags(args, mode), backend=args.backend, log_path=log_path,
            repo=getattr(args, "repo", None), python=getattr(args, "server_python", None),
        )  # fmt: skip
        try:
            server.launch()
            server.wait()
            if on_ready is not None:
                on_ready(mode, server)
            for n in args.levels:
                pid = server.proc.pid if server.proc is not None else None
                results.append(measure(server.url, mode, n, args.seconds, args.warmup, pairs, pid))
                print(f"  {mode:9s} clients={n:3d}: {results[-1].throughput:.1f} req/s", file=sys.stderr)
        finally:
            server.stop()
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.serve_load", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="export dir (onnx/trt) or checkpoint dir (torch): start servers here")
    src.add_argument("--url", help="a running server on loopback (measured as is, one mode)")
    add_load_arguments(p, clients="1,4,16")
    args = p.parse_args(argv)
    check_load_arguments(p, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pairs = load_pairs()
    if args.url:
        _check_loopback(args.url)
        url = args.url.rstrip("/")
        results = [measure(url, "external", n, args.seconds, args.warmup, pairs) for n in args.levels]
        title = f"{args.url}"
    else:
        results = run_modes(args, pairs, "serve_load")
        title = f"{args.backend} backend, {args.threads} intra-op thread(s), {os.cpu_count()} CPU(s), {args.seconds:g} s per row"
    print(markdown(results, title))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
