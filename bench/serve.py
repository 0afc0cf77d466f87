"""`python -m bench.serve`: the HTTP server against the bare backend, then under concurrent load.

    python -m bench.serve --model runs/demo/onnx --backend onnx --clients 1,4,16,64 --seconds 10
    python -m bench.serve --model models/squad2-small-int8 --backend null   # the host path alone

0. Host path. One client, one request at a time, against the batched server: the median of each
   stage the server reports (parse + validate, auth, featurize, queue, engine, decode, serialize), the
   server's total, and what lies outside it (HTTP parsing, the loopback, the client); beside it the
   echo floor (:mod:`bench.echo_app`, FastAPI + uvicorn alone) under the same client. With ``--backend
   null`` (fixed outputs, no model) the engine costs nothing, so every millisecond is the host's.
1. Overhead. The same questions, one at a time, (a) in this process through exactly the server's
   work minus HTTP (featurize -> pad -> ``Backend.run`` -> decode, the backend built by the server's
   own factory with the same threads) and (b) through ``POST /v1/answer`` of a server started here with
   micro-batching off (one window per backend call, as in (a)). The overhead is the median of the
   per-question differences (b - a): HTTP, JSON, validation, asyncio and the batcher's queue.
2. Load. Closed-loop clients (1/4/16/64 by default) against the server with micro-batching on and
   off; throughput, p50/p99 latency, errors, windows per backend call.
   The echo floor is loaded by the same clients at the same levels.
3. The targets, each as measured: overhead p50 <= 1 ms and end to end minus the engine alone <= 1.5 ms
   at one client; queue p50 at one client <= 0.1 ms; batching >= 1.5x the throughput at 16 clients;
   batched p99 at 16 clients against twice the single-client latency.

Client and server share this machine (loopback only), so the client's CPU use is part of the
numbers: the client is :mod:`bench.http_load` (requests encoded once, keep-alive, little parsing); on
2 cores, pin the backend to 1 thread to leave one for the client and the event loop.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from bench.common import cpu_summary, markdown_table, percentile
from bench.host_path import StageTable, answer_bodies, echo_server, encoded_requests, measure_stages
from bench.http_load import one_at_a_time, run_async
from bench.serve_load import (
    DEV,
    Result,
    add_load_arguments,
    check_load_arguments,
    load_pairs,
    markdown,
    measure,
    run_modes,
)
from harness.server_process import LOOPBACK, ServerProcess
from server.answering.model_spec import ModelSpecError

if TYPE_CHECKING:
    import numpy as np

    from qa_core.squad import Feature
    from server.answering.model_spec import ModelSpec
    from server.backends.base import Backend


@dataclass
class Overhead:
    questions: int
    bare_p50_ms: float
    http_p50_ms: float
    overhead_p50_ms: float
    overhead_p90_ms: float
    engine_p50_ms: float | None = None  # the backend calls alone, summed per question
    host_p50_ms: float | None = None  # HTTP end to end minus the engine alone, question by question


def seconds_each(answer: Callable[[str, str], object], pairs: Sequence[tuple[str, str]]) -> list[float]:
    """Seconds per question, in order, after answering the first three once (warm-up)."""
    for question, context in pairs[:3]:
        answer(question, context)
    seconds = []
    for question, context in pairs:
        start = time.perf_counter()
        answer(question, context)
        seconds.append(time.perf_counter() - start)
    return seconds


def window_rows(
    engine: Backend, spec: ModelSpec, features: Sequence[Feature]
) -> tuple[list[dict[str, np.ndarray]], float]:
    """One question's windows run one per backend call, like the server with batching off (each padded
    to the engine's least length): each window's outputs, and the seconds the calls took."""
    from qa_core.squad import pad_batch

    rows, spent = [], 0.0
    for feature in features:
        batch = pad_batch([feature], pad_to=max(spec.min_engine_seq_len or 0, len(feature.input_ids)))
        start = time.perf_counter()
        out = engine.run(batch)
        spent += time.perf_counter() - start
        rows.append({name: value[0] for name, value in out.items()})
    return rows, spent


def bare_latencies(
    model: str, backend: str, threads: int, pairs: Sequence[tuple[str, str]], server_args: str = ""
) -> tuple[list[float], list[float]]:
    """Seconds per question through the server's own host path (:class:`server.answering.host_path.HostPath`,
    built from the same settings, its context cache included), in process, one window per backend
    call (the backend as ``--server-args`` configure it, e.g. the torch backend on CUDA with graphs),
    and the seconds of its backend calls alone."""
    from qa_core.tokenizer import XLNetTokenizer
    from server.answering.host_path import HostPath, Question
    from server.answering.model_spec import resolve_spec
    from server.backends import create_backend
    from server.door.key_check import ANONYMOUS
    from server.flags import load_settings

    spec = resolve_spec(model, backend)
    flags = ["--model", model, "--backend", backend, "--threads", str(threads), *shlex.split(server_args)]
    s = load_settings(flags)
    engine = create_backend(spec, s)
    host = HostPath.from_settings(spec, XLNetTokenizer.from_dir(spec.tokenizer_dir), s)
    engine.warmup((max(16, spec.min_engine_seq_len or 0), spec.serving.max_seq_len), (1,))
    engine_seconds: list[float] = []

    def answer(question: str, context: str) -> None:
        items = [Question(question, context)]
        groups, _, contexts = host.featurize_checked(items, ANONYMOUS)
        rows, spent = window_rows(engine, spec, groups[0])
        engine_seconds.append(spent)
        host.decode_answers(items, groups, contexts, [rows])

    try:
        total = seconds_each(answer, pairs)
        return total, engine_seconds[-len(total) :]
    finally:
        engine.close()


def http_latencies(port: int, pairs: Sequence[tuple[str, str]]) -> list[float]:
    """Seconds per question through ``POST /v1/answer``, one request at a time on a kept-alive connection."""
    requests = encoded_requests(port, answer_bodies(pairs))
    replies = run_async(one_at_a_time(LOOPBACK, port, requests))
    bad = [r.status for r, _ in replies if r.status != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(replies)} requests failed (statuses {sorted(set(bad))})")
    return [seconds for _, seconds in replies]


def overhead(bare: Sequence[float], http: Sequence[float], engine: Sequence[float] | None = None) -> Overhead:
    diffs = [(h - b) * 1000 for b, h in zip(bare, http, strict=True)]
    host = [(h - e) * 1000 for e, h in zip(engine, http, strict=True)] if engine else None
    return Overhead(
        questions=len(diffs),
        bare_p50_ms=statistics.median(bare) * 1000,
        http_p50_ms=statistics.median(http) * 1000,
        overhead_p50_ms=statistics.median(diffs),
        overhead_p90_ms=percentile(diffs, 90),
        engine_p50_ms=statistics.median(engine) * 1000 if engine else None,
        host_p50_ms=statistics.median(host) if host else None,
    )


def target_lines(
    over: Overhead | None, results: Sequence[Result], stages: StageTable | None = None
) -> list[str]:
    """The serving targets, each with the measured value and met / not met."""

    def find(mode: str, clients: int) -> Result | None:
        return next((r for r in results if r.mode == mode and r.clients == clients), None)

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = []
    if over is not None and math.isfinite(over.overhead_p50_ms):
        ok = over.overhead_p50_ms <= 1.0
        lines.append(f"- server overhead p50 {over.overhead_p50_ms:.2f} ms (target <= 1 ms): {verdict(ok)}")
    if over is not None and over.host_p50_ms is not None:
        ok = over.host_p50_ms <= 1.5
        lines.append(
            f"- one client, end to end minus the engine alone p50 {over.host_p50_ms:.2f} ms "
            f"(target <= 1.5 ms): {verdict(ok)}"
        )
    if stages is not None and "queue" in stages.stages:
        queue = stages.stages["queue"]
        lines.append(f"- queue p50 at 1 client {queue:.3f} ms (target <= 0.1 ms): {verdict(queue <= 0.1)}")
    on, off = find("batched", 16), find("unbatched", 16)
    if on and off and off.throughput > 0:
        ratio = on.throughput / off.throughput
        lines.append(
            f"- micro-batching throughput at 16 clients {ratio:.2f}x (target >= 1.5x): {verdict(ratio >= 1.5)}"
        )
    one, two = find("fronts=1", 64), find("fronts=2", 64)
    if one and two and one.throughput > 0:
        lines.append(
            f"- 2 fronts over one engine vs 1 at 64 clients: {two.throughput / one.throughput:.2f}x req/s "
            f"({one.throughput:.0f} -> {two.throughput:.0f})"
        )
    single = find("unbatched", 1) or find("batched", 1)
    if on and single:
        budget = 2 * single.p50_ms
        lines.append(
            f"- batched p99 at 16 clients {on.p99_ms:.0f} ms vs 2x single-client p50 {budget:.0f} ms: "
            f"{verdict(on.p99_ms <= budget)}"
            + (f" (unbatched p99 {off.p99_ms:.0f} ms)" if off else "")
            + (f"; {closed_loop_floor(on)}" if on.throughput > 0 else "")
        )
    return lines


def closed_loop_floor(result: Result) -> str:
    """Little's law for a closed loop without think time: mean latency = clients / throughput.

    Any percentile at or above the median is bounded below by roughly this, whatever the server does,
    so "p99 <= 2x single-client latency" at 16 clients needs a batch of 16 to cost at most ~2 windows
    of compute (a GPU); on a compute-bound CPU it cannot hold.
    """
    floor_ms = 1000 * result.clients / result.throughput
    return f"{result.clients} closed-loop clients at {result.throughput:.1f} req/s mean {floor_ms:.0f} ms (Little's law)"


def stage_markdown(stages: StageTable, echo: StageTable | None) -> str:
    rows = [list(r) for r in stages.rows()]
    if echo is not None:
        rows.append(["echo floor (FastAPI + uvicorn alone), end to end", f"{echo.end_to_end:.3f}"])
    title = f"**Host path: one client, one request at a time, {stages.requests} requests (p50 ms)**"
    return f"{title}\n\n" + markdown_table(["stage", "p50 ms"], rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="export dir (onnx/trt/null) or checkpoint dir (torch)")
    p.add_argument("--data", type=Path, default=DEV, help="SQuAD JSON whose questions are asked")
    p.add_argument("--questions", type=int, default=100, help="questions in the overhead comparison")
    p.add_argument("--skip-overhead", action="store_true", help="only the load table")
    p.add_argument(
        "--skip-bare",
        action="store_true",
        help="keep the host-path stages, leave out the in-process comparison (no second backend: one "
        "compile, not three, with --torch-compile)",
    )
    p.add_argument("--no-echo", action="store_true", help="leave out the FastAPI + uvicorn echo floor")
    add_load_arguments(p, clients="1,4,16,64")
    args = p.parse_args(argv)
    if not Path(args.model).exists():
        p.error(f"--model {args.model} does not exist")
    if not args.data.exists():
        p.error(f"--data {args.data} does not exist")
    if args.questions < 1:
        p.error("--questions must be >= 1")
    check_load_arguments(p, args)
    check_server_args(p, args)
    return args


def check_server_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--server-args`` must be flags ``python -m server`` takes, with values its settings accept."""
    from pydantic import ValidationError

    from server.flags import FlagError, build_parser, load_settings

    flags = shlex.split(args.server_args)
    try:
        _, unknown = build_parser().parse_known_args(flags)
    except FlagError as exc:
        p.error(f"--server-args: {exc}")
    if unknown:
        p.error(f"--server-args: not flags of python -m server: {' '.join(unknown)}")
    try:
        load_settings(["--model", args.model, "--backend", args.backend, *flags])
    except ValidationError as exc:
        p.error(
            "--server-args: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (ModelSpecError, RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:  # bad model/server
        print(f"python -m bench.serve: error: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    pairs = load_pairs(args.data)
    asked = (pairs * (args.questions // len(pairs) + 1))[: args.questions]
    over: Overhead | None = None
    stages: StageTable | None = None
    bare: list[float] = []
    engine: list[float] = []
    compare_bare = not (args.skip_overhead or args.skip_bare)
    if compare_bare:
        print(f"bare backend: {len(asked)} questions ...", file=sys.stderr, flush=True)
        bare, engine = bare_latencies(args.model, args.backend, args.threads, asked, args.server_args)
    stage_mode = "batched" if "batched" in args.mode_list else args.mode_list[0]

    def on_ready(mode: str, server: ServerProcess) -> None:
        nonlocal over, stages
        if mode == stage_mode and not args.skip_overhead:
            print(f"host path ({mode}): {len(asked)} questions ...", file=sys.stderr, flush=True)
            stages = measure_stages(server.port, answer_bodies(asked))
        if mode == "unbatched" and compare_bare:
            print(f"HTTP, batching off: {len(asked)} questions ...", file=sys.stderr, flush=True)
            over = overhead(bare, http_latencies(server.port, asked), engine)
            if args.repo is not None:  # another checkout's server: this tree's in-process path is no baseline
                over.bare_p50_ms = over.overhead_p50_ms = over.overhead_p90_ms = float("nan")

    results = run_modes(args, pairs, "bench-serve", on_ready)
    if compare_bare and over is None:  # unbatched mode not requested: start it for the overhead alone
        only_overhead = argparse.Namespace(**{**vars(args), "mode_list": ["unbatched"], "levels": []})
        run_modes(only_overhead, pairs, "bench-serve-overhead", on_ready)
    echo_stages: StageTable | None = None
    if not args.no_echo:
        with echo_server(args.log_dir) as port:
            if not args.skip_overhead:
                echo_stages = measure_stages(port, answer_bodies(asked))
            for n in args.levels:
                results.append(
                    measure(f"http://{LOOPBACK}:{port}", "echo floor", n, args.seconds, args.warmup, pairs)
                )  # (its CPU is not counted: the echo server is not a child of a server process)
                print(f"  echo floor clients={n:3d}: {results[-1].throughput:.1f} req/s", file=sys.stderr)

    served_by = f", server from {args.repo}" if args.repo else ""
    print(
        f"# bench.serve: {args.backend} backend {args.server_args}, {args.threads} backend thread(s)"
        f"{served_by}; {cpu_summary()}\n"
    )
    if stages is not None:
        print(stage_markdown(stages, echo_stages) + "\n")
    if over is not None:
        print(
            f"**Overhead: server (HTTP, batching off) vs bare backend, {over.questions} questions one at a time**\n"
        )
        print(
            "| bare p50 ms | engine alone p50 ms | HTTP p50 ms | overhead p50 ms | overhead p90 ms | HTTP minus engine p50 ms |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        print(
            f"| {over.bare_p50_ms:.2f} | {over.engine_p50_ms or 0:.2f} | {over.http_p50_ms:.2f} | "
            f"{over.overhead_p50_ms:.2f} | {over.overhead_p90_ms:.2f} | {over.host_p50_ms or 0:.2f} |\n"
        )
    if results:
        print(
            markdown(
                results,
                f"Load: {args.seconds:g} s per row, max batch {args.max_batch_size}, delay {args.max_batch_delay_ms:g} ms",
            )
        )
        print()
    lines = target_lines(over, results, stages)
    if lines:
        print("**Targets**\n")
        print("\n".join(lines))
    if args.json:
        report = {
            "machine": cpu_summary(),
            "overhead": asdict(over) if over else None,
            "stages": asdict(stages) if stages else None,
            "echo_stages": asdict(echo_stages) if echo_stages else None,
            "load": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
