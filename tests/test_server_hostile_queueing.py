"""Queueing under hostile load, against real uvicorn on 127.0.0.1 and the batcher in-process: small
requests are not stuck behind a huge one, a large request meets its deadline while the server is
saturated, windows of departed clients are dropped, the request deadline covers featurizing, and the
tokenizing backlog is bounded. (The scheduling policy itself, with a fake clock: test_scheduling.py.)
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from hostile_server import app_server, slow_backend
from paths import REPO
from server_helpers import OK, WINDOWS, long_context, post, stand_in_spec

from qa_core.squad import featurize_one
from server.observability.metrics import sample_total

# ---- queueing: fair, bounded, and forgetting the departed ----------------------------------------------


def test_small_requests_are_not_stuck_behind_a_huge_one(onnx_export: Path, xlnet_tok) -> None:
    question = "What did the ministers decide?"
    big = {"question": question, "context": long_context(xlnet_tok, question, 30)}
    with app_server(onnx_export, slow_backend(0.02), max_batch_size=1, max_batch_delay_ms=0) as (url, _):
        finished: list[str] = []

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:

                async def ask(name: str, body: dict) -> None:
                    r = await c.post("/answer", json=body)
                    assert r.status_code == 200, r.text
                    finished.append(name)

                huge = asyncio.ensure_future(ask("big", big))
                await asyncio.sleep(0.15)  # its 30+ windows are queued (0.02 s each)
                await asyncio.gather(*(ask(f"small{i}", OK) for i in range(3)))
                await huge

        asyncio.run(scenario())
    assert finished[-1] == "big" and len(finished) == 4, finished


def test_a_large_request_meets_its_deadline_under_saturation(xlnet_tok) -> None:
    """Strict round-robin alone would give a 30-window request one slot per ring turn behind 8 busy
    clients asking about full windows (~3.5 s here); deadline-aware scheduling answers it (that it does
    so in time is pinned with a fake clock in test_scheduling.py) while the clients keep getting answers.
    Work that cannot meet its deadline is refused at admission, or failed before it runs."""
    from server.answering.batching import DeadlineUnreachable, MicroBatcher, QueueFull

    gate = threading.Event()
    gate.set()
    calls: list[int] = []

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        gate.wait()
        calls.append(batch["input_ids"].shape[0])
        time.sleep(1e-4 * batch["input_ids"].size)  # compute-bound: a batch costs what its tokens cost
        return {"start_logits": np.zeros(batch["input_ids"].shape)}

    question = "What did the ministers decide?"
    large = featurize_one(question, long_context(xlnet_tok, question, 30), xlnet_tok, **WINDOWS)
    words = long_context(xlnet_tok, question, 1).split()
    n = next(
        n
        for n in range(len(words), 0, -1)
        if len(featurize_one("Why?", " ".join(words[:n]), xlnet_tok, **WINDOWS)) == 1
    )
    small = featurize_one("Why?", " ".join(words[:n]), xlnet_tok, **WINDOWS)  # one full window
    huge = large * 8  # ~240 windows: at least 0.6 s alone, more than its 0.5 s deadline

    async def scenario() -> None:
        b = MicroBatcher(run, max_batch_size=4, max_delay_s=0.0, aging_s=0.0)
        b.start()
        stop = asyncio.Event()
        answered: list[str] = []

        async def client() -> None:
            while not stop.is_set():
                await b.submit(small)
                answered.append("small")

        clients = [asyncio.ensure_future(client()) for _ in range(8)]
        await asyncio.sleep(0.5)  # saturated, and the speed is measured
        before = len(answered)
        deadline = time.perf_counter() + 1.5  # ~0.55 s of work served first; ~3.5 s at one window per turn
        result = await b.submit_many([large], deadline=deadline)[0]  # not given up on: answered
        assert len(result.rows) == len(large)
        assert len(answered) - before >= 5  # the small clients were answered meanwhile, not shut out

        with pytest.raises(QueueFull, match="deadline"):
            b.submit_many([huge], deadline=time.perf_counter() + 0.5)

        stop.set()
        await asyncio.gather(*clients)
        gate.clear()  # the backend stalls for 1 s with a small question in it
        stalled = asyncio.ensure_future(b.submit(small))
        await asyncio.sleep(0.1)
        late = b.submit_many([large], deadline=time.perf_counter() + 0.8)[0]  # feasible when admitted
        calls_before = len(calls)
        await asyncio.sleep(1.0)
        gate.set()
        with pytest.raises(DeadlineUnreachable):
            await late
        await stalled
        assert len(calls) - calls_before <= 2  # none of its windows ran: they would have come too late
        assert b.queued == 0
        await b.drain()

    asyncio.run(scenario())


def test_windows_of_a_departed_client_are_dropped(onnx_export: Path, xlnet_tok) -> None:
    question = "What did the ministers decide?"
    big = {"question": question, "context": long_context(xlnet_tok, question, 60)}
    with app_server(onnx_export, slow_backend(0.02), max_batch_size=1, max_batch_delay_ms=0) as (url, _):
        calls_before = sample_total(httpx.get(url + "/metrics").text, "xlnetqa_batch_size_count")
        body = json.dumps(big).encode()
        head = f"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as client:
            client.sendall(head.encode() + body)
            queued = time.monotonic() + 30  # only a guard against a hang
            while sample_total(httpx.get(url + "/metrics").text, "xlnetqa_queue_depth") < 40:
                assert time.monotonic() < queued, "the request's windows were never queued"
                time.sleep(0.01)
        # the client gave up (its connection closed) with most of its 60 windows still queued
        give_up = time.monotonic() + 30  # only a guard against a hang
        while True:  # the server has seen the disconnect and its queue is empty
            text = httpx.get(url + "/metrics").text
            seen = sample_total(text, "xlnetqa_client_disconnects_total") == 1
            if seen and sample_total(text, "xlnetqa_queue_depth") == 0:
                break
            assert time.monotonic() < give_up, "the departed client's windows were never dropped"
            time.sleep(0.02)
        calls = sample_total(text, "xlnetqa_batch_size_count") - calls_before
        assert sample_total(text, "xlnetqa_client_disconnects_total") == 1
        assert sample_total(text, "xlnetqa_dropped_windows_total") >= 30
        assert calls < 30, calls
        assert sample_total(text, "xlnetqa_queue_depth") == 0
        assert post(url + "/answer", OK).status_code == 200


def test_the_deadline_covers_featurizing_queueing_and_inference(xlnet_tok) -> None:
    """request_timeout_s bounds the whole path (the route answers 504): a timeout while tokenizing queues
    nothing; one during inference drops the question's windows still queued."""
    from server.answering.batching import MicroBatcher
    from server.answering.host_path import HostPath, Question
    from server.answering.request_path import AnswerService, RequestTimeout
    from server.answering.window_queue import LocalQueue
    from server.limits.quotas import CallerLimits, CallerQuotas

    calls: list[int] = []

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(batch["input_ids"].shape[0])
        time.sleep(0.3)
        b, t = batch["input_ids"].shape
        return {"start_logits": np.zeros((b, t)), "end_logits": np.zeros((b, t)), "cls_logits": np.zeros(b)}

    spec = stand_in_spec(REPO)
    unlimited = CallerQuotas(CallerLimits(), 128)
    long_text = long_context(xlnet_tok, "Why?", 30)  # tokenizing it takes well over a millisecond

    async def scenario() -> None:
        batcher = MicroBatcher(run, max_batch_size=1, max_delay_s=0.0)
        batcher.start()
        pipeline = AnswerService(HostPath(spec, xlnet_tok), LocalQueue(batcher, unlimited), timeout_s=0.001)
        with pytest.raises(RequestTimeout):
            await pipeline.answer(Question("Why?", long_text))
        await asyncio.sleep(0.1)
        assert calls == [] and batcher.queued == 0  # timed out while tokenizing: nothing was queued
        t = time.perf_counter()
        windows = len(featurize_one("Why?", long_text, xlnet_tok, **WINDOWS))
        tokenizing = time.perf_counter() - t  # on a busy machine this alone can take a good part of a second
        pipeline.timeout_s = 2 * tokenizing + 0.45  # room to tokenize, then one or two windows of 0.3 s
        with pytest.raises(RequestTimeout):  # 30+ windows of 0.3 s each
            await pipeline.answer(Question("Why?", long_text))
        while batcher.busy or batcher.queued:  # the running window finishes, the queued ones are dropped
            await asyncio.sleep(0.01)
        assert 1 <= len(calls) < windows and batcher.queued == 0, (len(calls), windows)
        pipeline.timeout_s = 10
        answered = await pipeline.answer(Question("Why?", "Because."))
        assert answered.windows == 1 and 0 <= answered.prediction.no_answer_prob <= 1
        await batcher.drain()
        pipeline.close()

    asyncio.run(scenario())


def test_the_tokenizing_backlog_is_bounded(xlnet_tok) -> None:
    """Long inputs wait for one featurizing thread; beyond 32 maximal requests' worth of characters a
    request is refused at once (QueueFull: 503 + Retry-After) instead of queueing more tokenizing."""
    from server.answering.batching import MicroBatcher, QueueFull
    from server.answering.host_path import HostPath, Question, WorkLimits
    from server.answering.request_path import AnswerService
    from server.answering.window_queue import LocalQueue
    from server.limits.quotas import CallerLimits, CallerQuotas

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        b, t = batch["input_ids"].shape
        return {"start_logits": np.zeros((b, t)), "end_logits": np.zeros((b, t)), "cls_logits": np.zeros(b)}

    spec = stand_in_spec(REPO)
    unlimited = CallerQuotas(CallerLimits(), 128)
    context = long_context(xlnet_tok, "Why?", 10)  # over the inline limit: the featurizing thread
    limits = WorkLimits(max_normalized_chars=len(context) + 10, max_tokens=10**6, max_windows=10**4)

    async def scenario() -> None:
        batcher = MicroBatcher(run, max_batch_size=8, max_delay_s=0.0, max_queue=10**5)
        batcher.start()
        pipeline = AnswerService(HostPath(spec, xlnet_tok, limits=limits), LocalQueue(batcher, unlimited))
        outcomes = await asyncio.gather(
            *(pipeline.answer(Question("Why?", context)) for _ in range(48)), return_exceptions=True
        )
        refused = [o for o in outcomes if isinstance(o, QueueFull)]
        answered = [o for o in outcomes if not isinstance(o, BaseException)]
        assert len(refused) + len(answered) == 48, [o for o in outcomes if isinstance(o, BaseException)]
        assert 48 - 32 <= len(refused) < 48 and "waiting to be tokenized" in str(refused[0])
        assert all(a.windows >= 3 for a in answered)
        assert pipeline._backlog_chars == 0  # every refused or finished request gave its share back
        await batcher.drain()
        pipeline.close()

    asyncio.run(scenario())
