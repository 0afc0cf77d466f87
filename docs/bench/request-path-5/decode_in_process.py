"""The decode stage in process, as the server runs it (the decision's question-only work prepared first,
as it is while the engine runs): the sample's one-window questions, each decode timed hot (right after
another decode) and right after an onnxruntime forward of one window. Run from a tree's root with
``PYTHONPATH=.``; prints the median per case over 5 passes of 40 questions, three rounds."""

import statistics
import time
from pathlib import Path

from bench.decode_cases import cases
from bench.one_window import fitting_context
from qa_core.squad import pad_batch
from qa_core.tokenizer import XLNetTokenizer
from server.answering.host_path import HostPath, Question
from server.answering.model_spec import resolve_spec
from server.backends import create_backend
from server.door.key_check import ANONYMOUS
from server.flags import load_settings

MODEL = Path("models/squad2-small-int8")


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
    for round_ in (1, 2, 3):
        for case in ("hot", "after a forward"):
            times = []
            for _ in range(5):
                for items, groups, contexts, rows in prepared:
                    ahead = host.prepare_decisions(items, contexts)
                    if case == "after a forward":
                        engine.run(forward)
                    start = time.perf_counter()
                    host.decode_answers(items, groups, contexts, [rows], ahead)
                    times.append(time.perf_counter() - start)
            print(f"round {round_}, {case}: decode p50 {statistics.median(times) * 1000:.3f} ms")


if __name__ == "__main__":
    main()
