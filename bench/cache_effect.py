"""`python -m bench.cache_effect`: what a real engine call does to the host work around it, in process.

    python -m bench.cache_effect --model models/squad2-small-int8 --questions 100

1. Decoding: each sample question's outputs decoded (``HostPath.decode_answers``) in a loop of decodes,
   then each right after one 1x192 engine call, the same data both times: the difference is what the
   forward left behind in the caches, not more work.
2. The hops: the server's own ``AnswerService`` over ``LocalQueue`` (batching as the server's defaults),
   in process with no HTTP: per question, its engine stage minus the sum of its backend calls (thread
   hops, padding, delivery between a question's calls).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence

from bench.common import cpu_summary, markdown_table
from bench.serve import window_rows
from bench.serve_load import DEV, load_pairs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cache_effect", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="onnx")
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from qa_core.tokenizer import XLNetTokenizer
    from server.answering.host_path import HostPath, Question
    from server.answering.model_spec import resolve_spec
    from server.backends import create_backend, dummy_batch
    from server.door.key_check import ANONYMOUS
    from server.settings import ServerSettings

    s = ServerSettings(model=args.model, backend=args.backend, threads=args.threads)
    spec = resolve_spec(args.model, args.backend)
    engine = create_backend(spec, s)
    tokenizer = XLNetTokenizer.from_dir(spec.tokenizer_dir)
    host = HostPath.from_settings(spec, tokenizer, s)
    pairs = load_pairs(DEV)[: args.questions]
    prepared = []
    for question, context in pairs:
        items = [Question(question, context)]
        groups, _, contexts = host.featurize_checked(items, ANONYMOUS)
        rows, _ = window_rows(engine, spec, groups[0])
        prepared.append((items, groups, contexts, [rows]))
    for p_ in prepared:
        host.decode_answers(*p_)
    in_loop, after_call = [], []
    for p_ in prepared:
        start = time.perf_counter()
        host.decode_answers(*p_)
        in_loop.append(time.perf_counter() - start)
    forward = dummy_batch(1, spec.serving.max_seq_len)
    for p_ in prepared:
        engine.run(forward)
        start = time.perf_counter()
        host.decode_answers(*p_)
        after_call.append(time.perf_counter() - start)
    hops, calls = asyncio.run(_hops(engine, spec, tokenizer, s, pairs))
    print(f"# bench.cache_effect: {args.backend}, {spec.name}, {args.threads} thread(s); {cpu_summary()}\n")
    rows_out = [
        ["decode one question, in a loop of decodes", f"{1e6 * statistics.median(in_loop):.0f} µs"],
        [f"decode one question, right after a 1x{spec.serving.max_seq_len} engine call", f"{1e6 * statistics.median(after_call):.0f} µs"],
        ["engine stage minus its backend calls, per question (AnswerService in process)", f"{hops:.3f} ms"],
        ["backend calls per question", f"{calls:.2f}"],
    ]  # fmt: skip
    print(markdown_table(["what (p50)", "value"], rows_out))
    engine.close()
    return 0


async def _hops(engine, spec, tokenizer, settings, pairs) -> tuple[float, float]:
    from server.answering.batching import MicroBatcher
    from server.answering.host_path import HostPath, Question
    from server.answering.request_path import AnswerService
    from server.answering.window_queue import LocalQueue
    from server.limits.quotas import CallerLimits, CallerQuotas

    runs: list[float] = []

    def run(batch):
        start = time.perf_counter()
        out = engine.run(batch)
        runs.append(time.perf_counter() - start)
        return out

    batcher = MicroBatcher(
        run, max_batch_size=settings.max_batch_size, max_delay_s=settings.max_batch_delay_ms / 1000
    )
    batcher.start()
    quotas = CallerQuotas(CallerLimits(), settings.max_request_windows)
    service = AnswerService(HostPath.from_settings(spec, tokenizer, settings), LocalQueue(batcher, quotas))
    gaps, calls = [], []
    for k, (question, context) in enumerate(pairs * 2):
        before = len(runs)
        answered = await service.answer(Question(question, context))
        if k >= len(pairs):  # the first pass warms the context cache
            gaps.append(answered.timing_ms["inference"] - 1000 * sum(runs[before:]))
            calls.append(len(runs) - before)
    await batcher.drain()
    service.close()
    return statistics.median(gaps), statistics.mean(calls)


if __name__ == "__main__":
    sys.exit(main())
