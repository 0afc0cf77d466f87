"""`python -m bench.engine_batches`: what a batch saves the engine itself, per window, by batch size.

    python -m bench.engine_batches --model models/squad2-small-int8 --threads 1,2 --batches 1,2,4,8

The backend the server would build (same factory, same settings), called on dummy batches of each
shape after a warm-up; the table gives the median milliseconds per call and per window. Micro-batching
can raise a server's throughput only as far as a window costs less in a batch than alone (plus the
host work a batch shares): where the per-window cost is flat, batched and unbatched serve the same
rate, whatever the batcher does.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import cpu_summary, markdown_table
from qa_core.runtime.backends import SERVER_BACKENDS


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine_batches", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="onnx", choices=SERVER_BACKENDS)
    p.add_argument("--threads", default="1", help="comma-separated intra-op thread counts")
    p.add_argument("--batches", default="1,2,4,8")
    p.add_argument("--lengths", default="128,192")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument(
        "--server-args",
        default="",
        help="flags of python -m server the backend is built with (e.g. the torch backend on CUDA with graphs)",
    )
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    from server.answering.model_spec import resolve_spec
    from server.backends import create_backend, dummy_batch
    from server.flags import load_settings

    spec = resolve_spec(args.model, args.backend)
    rows = []
    batches, lengths = _ints(args.batches), _ints(args.lengths)
    for threads in _ints(args.threads):
        flags = ["--model", args.model, "--backend", args.backend, "--threads", str(threads)]
        settings = load_settings([*flags, *shlex.split(args.server_args)])
        engine = create_backend(spec, settings)
        engine.warmup((min(lengths), max(lengths)), (1, max(batches)))
        for length in lengths:
            alone = None
            for batch in batches:
                feeds = dummy_batch(batch, length)
                for _ in range(3):
                    engine.run(feeds)
                seconds = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    engine.run(feeds)
                    seconds.append(time.perf_counter() - start)
                ms = statistics.median(seconds) * 1000
                alone = alone or ms
                rows.append(
                    [
                        threads,
                        f"{batch}x{length}",
                        f"{ms:.2f}",
                        f"{ms / batch:.2f}",
                        f"{alone * batch / ms:.2f}",
                    ]
                )
        engine.close()
    header = ["threads", "BxT", "ms / call", "ms / window", "windows/s vs batch 1"]
    print(f"# bench.engine_batches: {args.backend} backend, {spec.name}; {cpu_summary()}")
    print(f"server flags: {args.server_args or '(defaults)'}\n")
    print(markdown_table(header, rows))
    if args.json:
        record = {"backend": args.backend, "model": spec.name, "server_args": args.server_args}
        record["machine"] = cpu_summary()
        record["rows"] = [dict(zip(header, row, strict=True)) for row in rows]
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
