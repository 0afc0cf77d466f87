"""What grouping saves the shipped model at load (server.answering.batch_curve.measure_grouping, as the
server measures it), written as JSON: ``python docs/bench/request-path-4/grouping_shipped.py OUT.json``
from the repository root (onnxruntime, 1 thread)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, ".")

from server.answering.batch_curve import measure_grouping  # noqa: E402
from server.answering.model_spec import resolve_spec  # noqa: E402
from server.backends import create_backend  # noqa: E402
from server.backends.base import dummy_batch  # noqa: E402
from server.flags import load_settings  # noqa: E402

MODEL = Path("models/squad2-small-int8")


def main(out: Path) -> None:
    spec = resolve_spec(MODEL, "onnx")
    backend = create_backend(spec, load_settings(["--model", str(MODEL), "--threads", "1"]))
    grouping = measure_grouping(backend.run, dummy_batch, spec.serving.max_seq_len, 8)
    out.write_text(json.dumps({"model": str(MODEL), "threads": 1, **grouping.describe()}, indent=2))
    print(out.read_text())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
