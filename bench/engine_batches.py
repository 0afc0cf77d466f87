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
import statistics
import sys
import time
from collections.abc import Sequence

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
    args = p.parse_args(argv)
    from server.answering.model_spec import resolve_spec
    from server.backends import create_backend, dummy_batch
    from server.settings import ServerSettings

    spec = resolve_spec(args.model, args.backend)
    rows = []
    for threads in _ints(args.threads):
        settings = ServerSettings(model=args.model, backend=args.backend, threads=threads)
        engine = create_backend(spec, settings)
        for length in _ints(args.lengths):
            alone = None
            for batch in _ints(args.batches):
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
    print(f"# bench.engine_batches: {args.backend} backend, {spec.name}; {cpu_summary()}\n")
    print(markdown_table(["threads", "BxT", "ms / call", "ms / window", "windows/s vs batch 1"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
