"""`python -m bench.paired`: this tree's server against another checkout's, request by request.

    python -m bench.paired --model models/squad2-small-int8 --repo ../before --server-python ../before-venv/bin/python

Both servers run at once (same model, backend, flags); one client sends every question to both, in
turn, alternating which goes first, one request at a time. Whatever drifts during the run (the
machine's clock speed, a neighbour on the host) drifts for both, so the per-question difference is the
servers' own. The engine alone is timed in-process on the same windows (this tree's featurizing, which
both trees share), and each server's host time per question is its end-to-end latency minus that.
Reports medians, the median paired difference with a 95% bootstrap interval over questions, and each
server's stages (``Server-Timing``, or the body's ``timing_ms`` for a build without it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.common import cpu_summary, markdown_table
from bench.host_path import answer_bodies, encoded_requests, reply_stages
from bench.http_load import Connection, Reply, run_async
from bench.serve import bare_latencies
from bench.serve_load import DEV, load_pairs
from harness.server_process import LOOPBACK, ServerProcess
from qa_core.runtime.backends import SERVER_BACKENDS

MODES = {"batched": (), "unbatched": ("--max-batch-size", "1", "--max-batch-delay-ms", "0")}


async def _alternate(
    ports: tuple[int, int], requests: tuple[list[bytes], list[bytes]], warmup: int
) -> list[list[tuple[Reply, float]]]:
    import time

    conns = [Connection(LOOPBACK, p) for p in ports]
    out: list[list[tuple[Reply, float]]] = [[], []]
    try:
        for k in range(len(requests[0])):
            order = (0, 1) if k % 2 == 0 else (1, 0)
            for side in order:
                start = time.perf_counter()
                reply = await conns[side].request(requests[side][k])
                if k >= warmup:
                    out[side].append((reply, time.perf_counter() - start))
    finally:
        for c in conns:
            await c.close()
    return out


def bootstrap_median(diffs: Sequence[float], seed: int = 0, n: int = 2000) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    values = np.asarray(diffs)
    medians = np.median(rng.choice(values, size=(n, len(values)), replace=True), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.paired", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="onnx", choices=SERVER_BACKENDS)
    p.add_argument("--repo", type=Path, required=True, help='the other checkout ("before")')
    p.add_argument("--server-python", help="the other checkout's interpreter (its own dependencies)")
    p.add_argument(
        "--data",
        type=Path,
        default=DEV,
        help="SQuAD JSON whose questions are asked (bench.one_window: one window each)",
    )
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20, help="questions sent first and not counted")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modes", default="batched,unbatched")
    p.add_argument("--server-args", default="")
    p.add_argument("--json", type=Path)
    p.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()))
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        p.error(f"--modes: choose from {sorted(MODES)}")
    pairs = load_pairs(args.data)
    asked = (pairs * (args.questions // len(pairs) + 1))[: args.questions]
    warm = asked[: args.warmup]
    _, engine = bare_latencies(args.model, args.backend, args.threads, warm + asked, args.server_args)
    engine = engine[len(warm) :]
    report: dict = {"machine": cpu_summary(), "data": str(args.data), "questions": len(asked), "modes": {}}
    print(f"# bench.paired: {args.backend} backend, {args.threads} thread(s); after = this tree, "
          f"before = {args.repo}; {cpu_summary()}\n")  # fmt: skip
    for mode in modes:
        flags = (*MODES[mode], "--threads", str(args.threads), *shlex.split(args.server_args))
        after = ServerProcess(
            args.model, *flags, backend=args.backend, log_path=args.log_dir / f"paired-after-{mode}.log"
        )
        before = ServerProcess(
            args.model, *flags, backend=args.backend, repo=args.repo, python=args.server_python,
            log_path=args.log_dir / f"paired-before-{mode}.log",
        )  # fmt: skip
        with after, before:
            bodies = answer_bodies(warm + asked)
            requests = (encoded_requests(after.port, bodies), encoded_requests(before.port, bodies))
            got_after, got_before = run_async(_alternate((after.port, before.port), requests, len(warm)))
        bad = [r.status for side in (got_after, got_before) for r, _ in side if r.status != 200]
        if bad:
            raise SystemExit(f"bench.paired: {len(bad)} requests failed ({sorted(set(bad))})")
        rows, summary = [], {}
        for name, got in (("before", got_before), ("after", got_after)):
            e2e = [s * 1000 for _, s in got]
            host = [t - e * 1000 for t, e in zip(e2e, engine, strict=True)]
            stages = [reply_stages(r) for r, _ in got]
            keys = sorted({k for st in stages for k in st})
            summary[name] = {
                "end_to_end_p50_ms": statistics.median(e2e),
                "host_p50_ms": statistics.median(host),
                "stages_p50_ms": {k: statistics.median(st[k] for st in stages if k in st) for k in keys},
            }
            rows.append([name, f"{statistics.median(e2e):.2f}", f"{statistics.median(engine) * 1000:.2f}",
                         f"{statistics.median(host):.2f}"])  # fmt: skip
        diffs = [(a - b) * 1000 for (_, a), (_, b) in zip(got_after, got_before, strict=True)]
        low, high = bootstrap_median(diffs)
        summary["after_minus_before_p50_ms"] = statistics.median(diffs)
        summary["interval_95"] = [low, high]
        report["modes"][mode] = summary
        print(f"**{mode}: {len(diffs)} questions, each to both servers in turn (p50 ms)**\n")
        print(
            markdown_table(
                ["server", "end to end", "engine alone (same windows)", "end to end minus engine"], rows
            )
        )
        print(f"\nafter minus before, per question: median {statistics.median(diffs):+.2f} ms, "
              f"95% bootstrap interval [{low:+.2f}, {high:+.2f}]\n")  # fmt: skip
        stage_rows = []
        for key in sorted(set(summary["before"]["stages_p50_ms"]) | set(summary["after"]["stages_p50_ms"])):
            stage_rows.append(
                [key]
                + [
                    f"{summary[n]['stages_p50_ms'][key]:.3f}" if key in summary[n]["stages_p50_ms"] else "-"
                    for n in ("before", "after")
                ]
            )
        print(markdown_table(["stage (server's own report)", "before", "after"], stage_rows) + "\n")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
