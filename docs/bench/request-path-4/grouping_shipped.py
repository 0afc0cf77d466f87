"""What grouping saves the shipped model (onnxruntime, 1 thread), written as JSON: every length the server
may measure at load (server.answering.batch_curve.measure_grouping, here not stopped at the first length
that does not pay), the server's decision from them, and for comparison the windows the straight line the
server drew before (one window against eight at the longest length) would have grouped.
``python docs/bench/request-path-4/grouping_shipped.py OUT.json`` from the repository root."""

import json
import sys
from pathlib import Path

sys.path.insert(0, ".")

from server.answering.batch_curve import MIN_SAVING, measure_grouping  # noqa: E402
from server.answering.model_spec import resolve_spec  # noqa: E402
from server.backends import create_backend  # noqa: E402
from server.backends.base import dummy_batch  # noqa: E402
from server.flags import load_settings  # noqa: E402

MODEL = Path("models/squad2-small-int8")


def straight_line_solo_from(one_s: float, many_s: float, length: int, size: int) -> int:
    """The previous rule: overhead + per-token cost through one point, windows grouped while the
    overhead is at least MIN_SAVING of a window's cost."""
    overhead = max(0.0, (size * one_s - many_s) / (size - 1))
    per_token = max(1e-12, (one_s - overhead) / length)
    return int(overhead * (1 - MIN_SAVING) / (MIN_SAVING * per_token)) + 1


def main(out: Path) -> None:
    spec = resolve_spec(MODEL, "onnx")
    backend = create_backend(spec, load_settings(["--model", str(MODEL), "--threads", "1"]))
    longest = spec.serving.max_seq_len
    every = measure_grouping(backend.run, dummy_batch, longest, 8, min_saving=float("-inf"))
    full = next(c for c in every.curves if c.length == longest and c.size == 8)
    report = {
        "model": str(MODEL),
        "threads": 1,
        "curves": [c.describe() for c in every.curves],
        "solo_from_tokens": every.solo_from(),
        "straight_line_solo_from_tokens": straight_line_solo_from(full.one_s, full.many_s, longest, 8),
    }
    out.write_text(json.dumps(report, indent=2))
    print(out.read_text())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
