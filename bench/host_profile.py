"""`python -m bench.host_profile`: where a server's host time goes, by component, sampled with py-spy.

    python -m bench.host_profile --model models/squad2-small-int8 --backend null --seconds 10

One client sends requests one at a time (the host path, not queueing, is what is profiled) while
``py-spy record`` samples every thread of the server at 1 kHz (``--raw`` keeps its collapsed stacks
for a flame graph: ``flamegraph.pl`` or speedscope; keep them out of the repository). Each sample's
stack is put in the first component whose rule matches a frame, innermost first; the table gives each
component's share of the busy samples (idle waits left out) and its microseconds per request, by
thread (the event loop, the inference thread, the featurizing thread). py-spy slows what it samples a
little: read shares, and the ``µs / request`` column as an upper bound. ``--repo`` profiles another
checkout's server (its own interpreter with ``--server-python``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.common import cpu_summary, markdown_table
from bench.host_path import answer_bodies, encoded_requests
from bench.http_load import Connection, run_async
from bench.serve_load import DEV, load_pairs
from harness.server_process import LOOPBACK, ServerProcess
from qa_core.runtime.backends import SERVER_BACKENDS

# (component, frame substrings that put a sample in it), checked innermost frame first.
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine: the model", ("Session.run", "NullBackend.run", "TorchBackend.run", "TrtBackend.run")),
    ("tokenize (sentencepiece + offsets)", ("encode_with_offsets", "SentencePieceProcessor")),
    ("windows (featurize)", ("featurize_encoded", "_featurize_example", "featurize_checked")),
    ("answerability rule (lexical features)", ("all_features", "ContextIndex", "decide")),
    ("decode (spans, n-best)", ("decode_head_outputs", "decode_answers", "_decode_all")),
    (
        "batcher and engine plumbing",
        ("batching.py", "scheduling.py", "window_queue", "engine/client", "run_in_executor"),
    ),
    (
        "serialize the answer",
        (
            "json_response",
            "_answer_fields",
            "orjson",
            "_to_response",
            "serialize_response",
            "jsonable_encoder",
        ),
    ),
    (
        "FastAPI routing, body and validation",
        (
            "fastapi/routing",
            "fastapi/dependencies",
            "starlette/routing",
            "pydantic",
            "request_body_to_args",
            "solve_dependencies",
        ),
    ),
    (
        "our middleware (door, limits, ids, metrics, timing)",
        (
            "server/door/key_check",
            "server/door/http_middleware",
            "server/door/body_limit",
            "server/door/hosts",
            "server/door/framing",
            "server/observability/request_ids",
            "server/observability/access_log",
            "server/observability/observe",
            "server/observability/metrics",
            "server/observability/timing",
            "prometheus_client",
        ),
    ),
    (
        "HTTP protocol (h11 / httptools) and transport",
        (
            "h11",
            "httptools",
            "protocols/http",
            "server/door/connection",
            "slow_clients",
            "uvloop",
            "selector_events",
            "sslproto",
        ),
    ),
    ("the event loop itself", ("asyncio/", "base_events", "events.py", "tasks.py")),
)
IDLE = (
    "select (",
    "epoll",
    "Condition.wait",
    "_worker (concurrent",
    "Queue.get",
    "poll (",
    "run_forever",
    "Runner.run (asyncio/runners.py:118)",
    "_run_once (asyncio/base_events.py:1909)",
)


def component(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        for name, needles in COMPONENTS:
            if any(n in frame for n in needles):
                return name
    return "other"


def aggregate(raw: Path) -> dict[str, Counter[str]]:
    """``{thread: {component: samples}}`` from py-spy's raw (collapsed) output, idle samples left out."""
    out: dict[str, Counter[str]] = {}
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = _thread_name(frames[0])
        if any(i in frames[-1] for i in IDLE):
            continue
        out.setdefault(thread, Counter())[component(frames[1:])] += int(count)
    return out


def _thread_name(head: str) -> str:
    if "MainThread" in head or "process" in head:
        return "event loop"
    if "inference" in head:
        return "inference thread"
    if "featurize" in head:
        return "featurize thread"
    return "other threads"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.host_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="null", choices=SERVER_BACKENDS)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    p.add_argument("--server-args", default="", help="more `python -m server` flags")
    p.add_argument("--repo", type=Path, help="profile this checkout's server")
    p.add_argument("--server-python", help="the interpreter the server runs under")
    p.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here (for a flame graph)")
    p.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()))
    args = p.parse_args(argv)
    if shutil.which("py-spy") is None:
        p.error("py-spy is not installed (pip install py-spy)")
    if not 0 < args.seconds <= 120:
        p.error("--seconds must be in (0, 120]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import shlex

    pairs = load_pairs(DEV)
    raw = args.raw or Path(tempfile.mkstemp(suffix=".txt")[1])
    server = ServerProcess(
        args.model, *shlex.split(args.server_args), backend=args.backend, repo=args.repo,
        python=args.server_python, log_path=args.log_dir / "host-profile.log",
    )  # fmt: skip
    with server:
        assert server.proc is not None
        requests = encoded_requests(server.port, answer_bodies(pairs))
        run_async(_send(server.port, requests, 2.0))  # warm: the context cache, the allocator
        spy = subprocess.Popen(
            ["py-spy", "record", "--format", "raw", "--rate", str(args.rate), "--threads", "--nonblocking",
             "--pid", str(server.proc.pid), "--duration", str(int(args.seconds) + 1), "--output", str(raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)
        answered = run_async(_send(server.port, requests, args.seconds))
        spy.wait(60)
    table = aggregate(raw)
    print(f"# bench.host_profile: {args.backend} backend {args.server_args}"
          f"{', server from ' + str(args.repo) if args.repo else ''}; {cpu_summary()}\n")  # fmt: skip
    print(f"{answered} requests one at a time in {args.seconds:g} s, py-spy at {args.rate} Hz\n")
    rows = []
    for thread, counts in table.items():
        busy = sum(counts.values())
        for name, n in counts.most_common():
            us = 1e6 * n / args.rate / max(1, answered)
            rows.append([thread, name, f"{100 * n / busy:.1f}%", f"{us:.0f}"])
    print(markdown_table(["thread", "component", "share of busy samples", "µs / request"], rows))
    if args.raw is None:
        os.unlink(raw)
    return 0


async def _send(port: int, requests: Sequence[bytes], seconds: float) -> int:
    conn, n = Connection(LOOPBACK, port), 0
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            reply = await conn.request(requests[n % len(requests)])
            if reply.status != 200:
                raise RuntimeError(f"the server answered {reply.status}: {reply.body[:200]!r}")
            n += 1
    finally:
        await conn.close()
    return n


if __name__ == "__main__":
    sys.exit(main())
