"""Why the decode stage is slower after a real forward (BENCHMARKS.md machine V): the server's host path in
process on the one-window sample questions (bench.decode_cases' texts), each decode timed right after one of
four things done on the same thread: nothing (hot), an onnxruntime forward of one window, a 4.5 ms sleep
(the thread idle for about a forward), a 4.5 ms busy loop. ``python docs/bench/request-path-4/decode_after_idle.py``
from the repository root; prints the median decode per case, two rounds."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")

from bench.decode_cases import cases  # noqa: E402
from bench.one_window import fitting_context  # noqa: E402
from qa_core.squad import pad_batch  # noqa: E402
from qa_core.tokenizer import XLNetTokenizer  # noqa: E402
from server.answering.host_path import HostPath, Question  # noqa: E402
from server.answering.model_spec import resolve_spec  # noqa: E402
from server.backends import create_backend  # noqa: E402
from server.door.key_check import ANONYMOUS  # noqa: E402
from server.flags import load_settings  # noqa: E402

MODEL = Path("models/squad2-small-int8")
IDLE_S = 0.0045


def main() -> None:
    spec = resolve_spec(MODEL, "onnx")
    engine = create_backend(spec, load_settings(["--model", str(MODEL), "--threads", "1"]))
    tokenizer = XLNetTokenizer.from_dir(spec.tokenizer_dir)
    host = HostPath.from_settings(spec, tokenizer, load_settings(["--model", str(MODEL)]))
    fits = lambda q, c: fitting_context(tokenizer, q, c, spec.serving.max_seq_len)  # noqa: E731
    pairs = cases(Path("data/sample/dev.json"), fits)["one-window sample questions (first 40)"]
    prepared = []
    for question, context in pairs:
        items = [Question(question, context)]
        groups, _, contexts = host.featurize_checked(items, ANONYMOUS)
        rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
        prepared.append((items, groups, contexts, rows))
    forward = pad_batch(prepared[0][1][0])

    def before_each(case: str) -> None:
        if case == "after a forward":
            engine.run(forward)
        elif case == "after a 4.5 ms sleep":
            time.sleep(IDLE_S)
        elif case == "after a 4.5 ms busy loop":
            start = time.perf_counter()
            while time.perf_counter() - start < IDLE_S:
                pass

    for round_ in (1, 2):
        for case in ("hot", "after a forward", "after a 4.5 ms sleep", "after a 4.5 ms busy loop"):
            times = []
            for _ in range(5):
                for items, groups, contexts, rows in prepared:
                    before_each(case)
                    start = time.perf_counter()
                    host.decode_answers(items, groups, contexts, [rows])
                    times.append(time.perf_counter() - start)
            print(f"round {round_}, {case}: decode p50 {statistics.median(times) * 1000:.3f} ms")


if __name__ == "__main__":
    main()
