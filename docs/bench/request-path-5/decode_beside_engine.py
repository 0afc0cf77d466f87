"""Can the loop thread be kept ready for the decode while the engine runs? The server's arrangement in
miniature: an asyncio loop hands each one-window sample question's forward to an inference thread, awaits
it (woken by ``call_soon_threadsafe``) and decodes on the loop, as the server does (decision prepared while
the engine runs). Four ways for the loop to wait, taken in turn question by question (ABBA over passes):

* ``block``: the loop sleeps in epoll (the server today);
* ``spin``: the loop polls (``epoll(0)``, the lock released each time) until the forward is done;
* ``pinned``: the loop on CPU 0, the inference thread on CPU 1 (no thread follows the other's cache);
* ``pinned+spin``: both.

Prints per way the median decode, the wake-up (forward done -> the loop resumes) and the whole question
(forward handed over -> decoded), ms. ``PYTHONPATH=. python docs/bench/request-path-5/decode_beside_engine.py``
"""

import asyncio
import os
import select
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.decode_cases import cases
from bench.one_window import fitting_context
from qa_core.squad import pad_batch
from qa_core.tokenizer import XLNetTokenizer
from server.answering.gil import prefer_latency
from server.answering.host_path import HostPath, Question
from server.answering.model_spec import resolve_spec
from server.backends import create_backend
from server.door.key_check import ANONYMOUS
from server.flags import load_settings

MODEL = Path("models/squad2-small-int8")
WAYS = ("block", "spin", "pinned", "pinned+spin")
ALL_CPUS = os.sched_getaffinity(0)


def main() -> None:
    prefer_latency()
    spec = resolve_spec(MODEL, "onnx")
    engine = create_backend(spec, load_settings(["--model", str(MODEL), "--threads", "1"]))
    tokenizer = XLNetTokenizer.from_dir(spec.tokenizer_dir)
    host = HostPath.from_settings(spec, tokenizer, load_settings(["--model", str(MODEL)]))
    fits = lambda q, c: fitting_context(tokenizer, q, c, spec.serving.max_seq_len)  # noqa: E731
    pairs = cases(Path("data/sample/dev.json"), fits)["one-window sample questions (first 40)"]
    questions = []
    for question, context in pairs:
        items = [Question(question, context)]
        groups, _, contexts = host.featurize_checked(items, ANONYMOUS)
        rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
        questions.append((items, groups, contexts, rows, pad_batch(groups[0])))
    pool = ThreadPoolExecutor(1)
    poller = select.epoll()

    def place_worker(cpus: set[int]) -> None:
        pool.submit(os.sched_setaffinity, 0, cpus).result()

    async def one(way: str, items, groups, contexts, rows, batch) -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        pinned = way.startswith("pinned")
        os.sched_setaffinity(0, {0} if pinned else ALL_CPUS)
        place_worker({1} if pinned else ALL_CPUS)
        done, ended = threading.Event(), []
        future = loop.create_future()

        def forward() -> None:
            engine.run(batch)
            ended.append(time.perf_counter())
            done.set()
            loop.call_soon_threadsafe(future.set_result, None)

        start = time.perf_counter()
        pool.submit(forward)
        ahead = host.prepare_decisions(items, contexts)
        if way.endswith("spin"):
            limit = time.perf_counter() + 0.05
            while not done.is_set() and time.perf_counter() < limit:
                poller.poll(0)
        await future
        woke = time.perf_counter()
        host.decode_answers(items, groups, contexts, [rows], ahead)
        decoded = time.perf_counter()
        return decoded - woke, woke - ended[0], decoded - start

    async def measure() -> None:
        results: dict[str, list[tuple[float, float, float]]] = {w: [] for w in WAYS}
        for n in range(8):
            for q in questions:
                for way in WAYS if n % 2 == 0 else WAYS[::-1]:
                    results[way].append(await one(way, *q))
                    await asyncio.sleep(0.0005)
        for way, got in results.items():
            decode, wake, whole = (statistics.median(x) * 1000 for x in zip(*got, strict=True))
            print(f"{way:12s} decode {decode:.3f}  wake-up {wake:.3f}  whole question {whole:.3f}")

    print(f"python {sys.version.split()[0]}, {len(questions)} questions x 8 passes per way")
    for round_ in (1, 2):
        print(f"round {round_}")
        asyncio.run(measure())


if __name__ == "__main__":
    main()
