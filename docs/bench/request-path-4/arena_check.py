"""The onnxruntime arena check of BENCHMARKS.md machine V: is one window slower once the session has run
batch-8 calls (the batched server's warm-up and batch curve)? ``python docs/bench/request-path-4/arena_check.py
small|big`` from the repository root: the median of 60 calls of one 150-token window, four times, after
five batch-8 calls of 192 tokens ("big") or none ("small")."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")

from server.answering.model_spec import resolve_spec  # noqa: E402
from server.backends import create_backend  # noqa: E402
from server.backends.base import dummy_batch  # noqa: E402
from server.flags import load_settings  # noqa: E402

MODEL = Path("models/squad2-small-int8")


def median_ms(backend, batch, calls: int = 60) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        backend.run(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    spec = resolve_spec(MODEL, "onnx")
    backend = create_backend(spec, load_settings(["--model", str(MODEL), "--threads", "1"]))
    one, eight = dummy_batch(1, 150), dummy_batch(8, 192)
    backend.run(one)
    if sys.argv[1] == "big":
        for _ in range(5):
            backend.run(eight)
    print(sys.argv[1], " ".join(f"{median_ms(backend, one):.3f}" for _ in range(4)))


if __name__ == "__main__":
    main()
