"""``python -m bench.decode_cases``: the decode stage on texts built to make it slow or wrong, per pool size.

Four cases through the server's own host path in process (featurize, the backend once per window,
then ``decode_answers`` timed alone, each question's median of ``--runs`` taken in turn over all): a context that is one 12,000-letter word
(its best span must stay within max_answer_len tokens), a 20,000-character context of short sentences
with a 150-word question (the sentence match), the sample questions (two or three windows each), and
the same questions with their contexts cut to fit one window (``bench.one_window``: the issue's unit).
Each at every ``--pools`` size (``--n-best-pool``); the best span's length in characters beside it.

    python -m bench.decode_cases --model models/squad2-small-int8 --pools 20,100 --json FILE

Run against another checkout (a "before"): ``PYTHONPATH=/that/checkout python bench/decode_cases.py ...``
from this one (the host path's interface is the same).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

MODEL = Path("models/squad2-small-int8")
SAMPLE_DEV = Path("data/sample/dev.json")


def cases(sample: Path, fits: Callable[[str, str], str] | None = None) -> dict[str, list[tuple[str, str]]]:
    """The texts, by case; ``fits(question, context)``: the context cut to one window of the model
    (bench.one_window), for the one-window case (left out without it)."""
    rng = random.Random(0)
    word = "".join(rng.choice("abcdefghij") for _ in range(12_000))
    sentences = " ".join(f"Item {i} was made in town {i % 97} by worker {i % 13}." for i in range(420))[
        :20_000
    ]
    question = " ".join(f"word{i} town" for i in range(75))
    data = json.loads(sample.read_text())
    pairs = [(qa["question"], p["context"]) for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]]
    out = {
        "12,000-letter word": [("What is the word?", word)],
        "20,000 characters of short sentences, 150-word question": [(question, sentences)],
        "sample questions (first 40)": pairs[:40],
    }
    if fits is not None:  # the figure is per one-window question: each context cut to fit one
        cut = [(q, fits(q, c)) for q, c in pairs]
        out["one-window sample questions (first 40)"] = [(q, c) for q, c in cut if c][:40]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.decode_cases", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--data", type=Path, default=SAMPLE_DEV)
    p.add_argument("--pools", default="default,20,100", help="n-best pools; default: the server's own")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    from bench.one_window import fitting_context
    from qa_core.squad import pad_batch
    from qa_core.tokenizer import XLNetTokenizer
    from server.answering.host_path import HostPath, Question
    from server.answering.model_spec import resolve_spec
    from server.backends import create_backend
    from server.door.key_check import ANONYMOUS
    from server.flags import load_settings

    spec = resolve_spec(args.model, "onnx")
    engine = create_backend(spec, load_settings(["--model", str(args.model), "--threads", "1"]))
    tokenizer = XLNetTokenizer.from_dir(spec.tokenizer_dir)
    rows_out = []
    window = spec.serving.max_seq_len
    for name, pairs in cases(args.data, lambda q, c: fitting_context(tokenizer, q, c, window)).items():
        prepared = []
        first = HostPath.from_settings(spec, tokenizer, load_settings(["--model", str(args.model)]))
        for question, context in pairs:
            items = [Question(question, context)]
            groups, _, contexts = first.featurize_checked(items, ANONYMOUS)
            rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
            prepared.append((items, groups, contexts, rows))
        for pool in args.pools.split(","):
            flags = [] if pool == "default" else ["--n-best-pool", pool]
            host = HostPath.from_settings(
                spec, tokenizer, load_settings(["--model", str(args.model), *flags])
            )
            times: list[list[float]] = [[] for _ in prepared]
            longest = 0
            for _ in range(args.runs):  # round robin: a question never follows itself, as in serving
                for spent, (items, groups, contexts, rows) in zip(times, prepared, strict=True):
                    start = time.perf_counter()
                    preds, _ = host.decode_answers(items, groups, contexts, [rows])
                    spent.append((time.perf_counter() - start) * 1000)
                    longest = max(longest, len(preds[0].best_span_text))
            per_question = [statistics.median(t) for t in times]
            row = {
                "case": name,
                "pool": pool,
                "questions": len(prepared),
                "windows": sum(len(g[0]) for _, g, _, _ in prepared),
                "decode p50 ms": statistics.median(per_question),
                "decode max ms": max(per_question),
                "longest best span (chars)": longest,
            }
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "rows": rows_out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
