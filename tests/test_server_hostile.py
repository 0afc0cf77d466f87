"""The server as a hostile client and a failing backend meet it, against real uvicorn on 127.0.0.1.

Bounded error bodies, limits on work (not characters), inputs without tokens, fair queueing, windows of
departed clients dropped, the deadline covering featurizing, request ids instead of internals, and
honest health when the backend hangs, returns NaN, fails to load or the batcher crashes. Faults are
injected by wrapping the real ONNX backend (a question holding ``<eop>`` triggers them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import OK, REPO, WINDOWS, ServerProcess, long_context, post

from export.runtime.sidecar import Sidecar
from server.metrics import sample_total
from server.process import LOOPBACK as HOST
from server.process import free_port
from train.squad import featurize_one

EOP = 8  # "<eop>" in a question: the injected fault's trigger
FAULTY = {"question": "What is <eop> here?", "context": "Nothing happened here."}


# ---- helpers ---------------------------------------------------------------------------------------------


def faulty_backend(fault: Callable) -> Callable:
    """A backend factory: the real backend, but batches holding <eop> go through ``fault(run, batch)``."""
    from server.backends import create_backend

    def factory(spec, settings):
        backend = create_backend(spec, settings)
        run = backend.run

        def run_or_fault(batch):
            return fault(run, batch) if (batch["input_ids"] == EOP).any() else run(batch)

        backend.run = run_or_fault
        return backend

    return factory


def slow_backend(seconds: float) -> Callable:
    """Every call takes at least ``seconds`` (a big model on a small CPU), so queueing order is visible."""
    from server.backends import create_backend

    def factory(spec, settings):
        backend = create_backend(spec, settings)
        run = backend.run

        def slow(batch):
            time.sleep(seconds)
            return run(batch)

        backend.run = slow
        return backend

    return factory


@contextlib.contextmanager
def app_server(
    model: Path, backend_factory: Callable | None = None, **settings
) -> Iterator[tuple[str, object]]:
    """uvicorn serving ``create_app`` in a thread; yields (url, app) once the model is ready or failed."""
    import uvicorn

    from server.app import create_app
    from server.settings import ServerSettings

    config = ServerSettings(model=model, port=free_port(), **settings)
    app = create_app(config, backend_factory=backend_factory)
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=config.port, log_level="critical"))
    thread = threading.Thread(target=server.run)
    thread.start()
    url = f"http://{HOST}:{config.port}"
    try:
        deadline = time.monotonic() + 60
        while not (server.started and app.state.runtime.state in ("ready", "failed")):
            assert time.monotonic() < deadline and thread.is_alive(), "in-process server did not start"
            time.sleep(0.02)
        yield url, app
    finally:
        server.should_exit = True
        thread.join(60)


async def _post_many(url: str, bodies: list[dict], timeout: float = 60) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as c:
        return await asyncio.gather(*(c.post("/answer", json=b) for b in bodies))


# ---- the three measured attacks ----------------------------------------------------------------------


def test_huge_invalid_batch_gets_a_small_error_at_once(onnx_server: ServerProcess) -> None:
    body = b'{"items":[' + b",".join([b"1"] * 400_000) + b"]}"  # 800 KB, every item invalid
    r = post(onnx_server.url + "/answer/batch", None, raw=body)
    assert r.status_code == 413 and r.json()["error"] == "too_many_items", r.text[:300]
    assert "400000" in r.json()["message"] and len(r.content) < 1000
    # Within the item limit, every item wrong in three ways: five details and the count of the rest.
    items = [{"question": 1, "context": 2, "top_k": "x"} for _ in range(32)]
    r = post(onnx_server.url + "/answer/batch", {"items": items})
    err = r.json()
    assert r.status_code == 422 and len(err["details"]) == 5 and err["details_omitted"] == 32 * 3 - 5
    assert "(+91 more)" in err["message"] and len(r.content) < 3000
    # A million unknown fields are one error naming a few of them, not a million.
    fields = ",".join(f'"f{i}":1' for i in range(600_000))
    r = post(
        onnx_server.url + "/answer", None, raw=('{"question":"a","context":"b",' + fields + "}").encode()
    )
    assert r.status_code == 413  # over this server's 1 MB body limit: refused before parsing
    fields = ",".join(f'"f{i}":1' for i in range(60_000))
    r = post(
        onnx_server.url + "/answer", None, raw=('{"question":"a","context":"b",' + fields + "}").encode()
    )
    err = r.json()
    assert r.status_code == 422 and "unknown field" in err["message"] and "'f0'" in err["message"]
    assert "(+59997 more)" in err["message"] and len(r.content) < 2000


def test_expanding_unicode_is_refused_before_tokenizing(onnx_server: ServerProcess) -> None:
    before = httpx.get(onnx_server.url + "/metrics").text
    r = post(onnx_server.url + "/answer", {"question": "What?", "context": "\ufdfa" * 20_000})
    err = r.json()
    assert r.status_code == 413 and err["error"] == "too_many_characters", r.text
    assert (
        "360005" in err["message"] and "65536" in err["message"] and "max_normalized_chars" in err["message"]
    )
    after = httpx.get(onnx_server.url + "/metrics").text
    assert sample_total(after, "xlnetqa_batch_size_count") == sample_total(before, "xlnetqa_batch_size_count")
    # The same text sent raw, within the character limit, is fine: only the expansion is refused.
    assert (
        post(onnx_server.url + "/answer", {"question": "What?", "context": "\ufdfa" * 100}).status_code == 200
    )


def test_question_without_tokens_is_422(onnx_server: ServerProcess) -> None:
    for question in ("\u200b", "\u200b\u200d\ufeff", " \u2060 "):
        r = post(onnx_server.url + "/answer", {"question": question, "context": "Something happened."})
        assert r.status_code == 422 and r.json()["error"] == "empty_question", (question, r.text)
        assert "no tokens" in r.json()["message"]


# ---- limits on work ------------------------------------------------------------------------------------


def test_token_and_window_limits_count_the_whole_request(
    onnx_export: Path, xlnet_tok, tmp_path: Path
) -> None:
    question = "What did they decide?"
    context = long_context(xlnet_tok, question, 3)
    windows = len(featurize_one(question, context, xlnet_tok, **WINDOWS))
    tokens = len(xlnet_tok.encode(question)) + len(xlnet_tok.encode(context))
    flags = ("--max-request-windows", str(windows), "--max-request-tokens", str(2 * tokens - 1))
    s = ServerProcess(onnx_export, tmp_path, *flags).start()
    try:
        item = {"question": question, "context": context}
        assert post(s.url + "/answer", item).status_code == 200  # exactly at the window limit
        r = post(s.url + "/answer/batch", {"items": [OK, item]})  # one more window than allowed
        err = r.json()
        assert r.status_code == 413 and err["error"] == "too_many_windows"
        assert f"has {windows + 1} windows" in err["message"] and f"limit is {windows}" in err["message"]
        r = post(s.url + "/answer/batch", {"items": [item, item, OK]})  # tokens: stops counting early
        err = r.json()
        assert r.status_code == 413 and err["error"] == "too_many_tokens"
        assert f"at least {2 * tokens}" in err["message"] and "max_request_tokens" in err["message"]
        info = httpx.get(s.url + "/v1/model").json()["limits"]
        assert (info["max_request_windows"], info["max_request_tokens"]) == (windows, 2 * tokens - 1)
    finally:
        s.stop()


def test_typical_requests_pass_the_default_limits(onnx_server: ServerProcess) -> None:
    """The README's example and every sample paragraph, all in one batch request, are within the defaults
    (the sample's 24 paragraphs are ~110 windows of this test model's 128 tokens)."""
    readme = {
        "question": "Who gave their name to Normandy?",
        "context": "The Normans ... gave their name to Normandy ...",
    }
    data = json.loads((REPO / "data" / "sample" / "dev.json").read_text())
    items = [
        {"question": p["qas"][0]["question"], "context": p["context"]}
        for a in data["data"]
        for p in a["paragraphs"]
    ]
    assert post(onnx_server.url + "/answer", readme).status_code == 200
    r = post(onnx_server.url + "/answer/batch", {"items": [readme, *items]})
    assert r.status_code == 200, r.text


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
    clients asking about full windows (~3.5 s here); deadline-aware scheduling finishes it in time while the clients keep getting
    answers. Work that cannot meet its deadline is refused at admission, or failed before it runs."""
    from server.batching import DeadlineUnreachable, MicroBatcher, QueueFull

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
        answered: list[float] = []

        async def client() -> None:
            while not stop.is_set():
                await b.submit(small)
                answered.append(time.perf_counter())

        clients = [asyncio.ensure_future(client()) for _ in range(8)]
        await asyncio.sleep(0.5)  # saturated, and the speed is measured
        start = time.perf_counter()
        deadline = start + 1.5  # ~0.55 s of work served first; ~3.5 s at one window per ring turn
        result = await b.submit_many([large], deadline=deadline)[0]
        done = time.perf_counter()
        assert done < deadline and len(result.rows) == len(large)
        assert sum(start < t < done for t in answered) >= 5  # the small clients were not shut out

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
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/answer", json=big, timeout=0.2)  # the client gives up and disconnects
        time.sleep(1.5)  # longer than its 60+ windows would have taken
        text = httpx.get(url + "/metrics").text
        calls = sample_total(text, "xlnetqa_batch_size_count") - calls_before
        assert sample_total(text, "xlnetqa_client_disconnects_total") == 1
        assert sample_total(text, "xlnetqa_dropped_windows_total") >= 30
        assert calls < 30, calls
        assert sample_total(text, "xlnetqa_queue_depth") == 0
        assert post(url + "/answer", OK).status_code == 200


def test_the_deadline_covers_featurizing_queueing_and_inference(xlnet_tok) -> None:
    """request_timeout_s bounds the whole path (the route answers 504): a timeout while tokenizing queues
    nothing; one during inference drops the question's windows still queued."""
    from server.batching import MicroBatcher
    from server.model_spec import ModelSpec
    from server.pipeline import QAPipeline, Question, RequestTimeout

    calls: list[int] = []

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(batch["input_ids"].shape[0])
        time.sleep(0.3)
        b, t = batch["input_ids"].shape
        return {"start_logits": np.zeros((b, t)), "end_logits": np.zeros((b, t)), "cls_logits": np.zeros(b)}

    spec = ModelSpec(name="t", directory=REPO, tokenizer_dir=REPO, head="shallow", kind="export", **WINDOWS)
    long_text = long_context(xlnet_tok, "Why?", 30)  # tokenizing it takes well over a millisecond

    async def scenario() -> None:
        batcher = MicroBatcher(run, max_batch_size=1, max_delay_s=0.0)
        batcher.start()
        pipeline = QAPipeline(spec, xlnet_tok, batcher, timeout_s=0.001)
        with pytest.raises(RequestTimeout):
            await pipeline.answer(Question("Why?", long_text))
        await asyncio.sleep(0.1)
        assert calls == [] and batcher.queued == 0  # timed out while tokenizing: nothing was queued
        t = time.perf_counter()
        featurize_one("Why?", long_text, xlnet_tok, **WINDOWS)
        tokenizing = time.perf_counter() - t  # on a busy machine this alone can take a good part of a second
        pipeline.timeout_s = 2 * tokenizing + 0.45  # room to tokenize, then one or two windows of 0.3 s
        with pytest.raises(RequestTimeout):  # 30+ windows of 0.3 s each
            await pipeline.answer(Question("Why?", long_text))
        await asyncio.sleep(0.4)  # the running window finishes; the question's other windows are dropped
        assert 1 <= len(calls) <= 2 + int(tokenizing / 0.3) and batcher.queued == 0, (len(calls), tokenizing)
        pipeline.timeout_s = 10
        answered = await pipeline.answer(Question("Why?", "Because."))
        assert answered.windows == 1 and 0 <= answered.prediction.no_answer_prob <= 1
        await batcher.drain()
        pipeline.close()

    asyncio.run(scenario())


def test_the_tokenizing_backlog_is_bounded(xlnet_tok) -> None:
    """Long inputs wait for one featurizing thread; beyond 32 maximal requests' worth of characters a
    request is refused at once (QueueFull: 503 + Retry-After) instead of queueing more tokenizing."""
    from server.batching import MicroBatcher, QueueFull
    from server.model_spec import ModelSpec
    from server.pipeline import QAPipeline, Question, WorkLimits

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        b, t = batch["input_ids"].shape
        return {"start_logits": np.zeros((b, t)), "end_logits": np.zeros((b, t)), "cls_logits": np.zeros(b)}

    spec = ModelSpec(name="t", directory=REPO, tokenizer_dir=REPO, head="shallow", kind="export", **WINDOWS)
    context = long_context(xlnet_tok, "Why?", 10)  # over the inline limit: the featurizing thread
    limits = WorkLimits(max_normalized_chars=len(context) + 10, max_tokens=10**6, max_windows=10**4)

    async def scenario() -> None:
        batcher = MicroBatcher(run, max_batch_size=8, max_delay_s=0.0, max_queue=10**5)
        batcher.start()
        pipeline = QAPipeline(spec, xlnet_tok, batcher, limits=limits)
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


# ---- failures: hangs, NaN, crashes, load errors ---------------------------------------------------------


def test_a_hung_backend_call_makes_the_server_unhealthy_until_it_returns(onnx_export: Path) -> None:
    release = threading.Event()

    def hang(run, batch):
        release.wait(30)
        return run(batch)

    watchdog = {"watchdog_min_s": 0.3, "watchdog_factor": 2.0, "max_batch_delay_ms": 0}
    with app_server(onnx_export, faulty_backend(hang), **watchdog) as (url, _):
        try:
            r = post(url + "/answer", FAULTY)
            assert r.status_code == 503 and r.json()["error"] == "unhealthy" and r.headers["retry-after"]
            for path in ("/readyz", "/healthz"):
                r = httpx.get(url + path)
                assert r.status_code == 503 and r.json() == {"status": "unhealthy"}, path
            r = post(url + "/answer", OK)
            assert r.status_code == 503 and r.json()["error"] == "unhealthy"
            text = httpx.get(url + "/metrics").text
            assert (
                sample_total(text, "xlnetqa_backend_hangs_total") == 1
                and sample_total(text, "xlnetqa_ready") == 0
            )
        finally:
            release.set()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/readyz").status_code != 200:  # the call returned: healthy again
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert post(url + "/answer", OK).status_code == 200
        assert httpx.get(url + "/healthz").json() == {"status": "ready"}


def test_backend_failure_fails_only_its_batch_and_logs_it_under_the_request_ids(
    onnx_export: Path, caplog
) -> None:
    def fail(run, batch):
        raise RuntimeError("poisoned batch at /secret/path")

    with app_server(onnx_export, faulty_backend(fail), max_batch_size=8, max_batch_delay_ms=300) as (url, _):
        # The faulty question shares its backend call (300 ms delay, room for 8) with three others.
        shared = asyncio.run(_post_many(url, [FAULTY, OK, OK, OK]))
        assert [r.status_code for r in shared] == [500] * 4
        failed = [r.json() for r in shared]
        assert all(b["error"] == "inference_failed" for b in failed)
        assert all("poisoned" not in r.text and "/secret" not in r.text for r in shared)
        logged = [r for r in caplog.records if r.name == "server.batching" and r.exc_info]
        assert len(logged) == 1 and "poisoned batch" in str(logged[0].exc_info[1])
        assert all(b["request_id"] in logged[0].getMessage() for b in failed)
        assert post(url + "/answer", OK).status_code == 200  # later batches are unaffected
        assert httpx.get(url + "/readyz").status_code == 200
        assert sample_total(httpx.get(url + "/metrics").text, "xlnetqa_batch_failures_total") == 1


def test_non_finite_outputs_are_a_500_never_a_null(onnx_export: Path) -> None:
    def nan(run, batch):
        outputs = run(batch)
        outputs["start_logits"] = np.full_like(outputs["start_logits"], np.nan)
        return outputs

    with app_server(onnx_export, faulty_backend(nan), max_batch_delay_ms=0) as (url, _):
        r = post(url + "/answer", FAULTY)
        assert r.status_code == 500 and r.json()["error"] == "non_finite_output", r.text
        assert post(url + "/answer", OK).status_code == 200  # only that request failed
        text = httpx.get(url + "/metrics").text
        assert sample_total(text, "xlnetqa_non_finite_outputs_total") == 1
        assert httpx.get(url + "/readyz").status_code == 200


def test_a_crashed_batcher_is_unhealthy_not_shutting_down(onnx_export: Path) -> None:
    with app_server(onnx_export, max_batch_delay_ms=0) as (url, app):
        batcher = app.state.runtime.batcher

        async def broken() -> list:
            raise RuntimeError("collector bug")

        batcher._form_batch = broken  # the next batch crashes the collector task
        r = post(url + "/answer", OK)
        assert r.status_code == 503 and r.json()["error"] == "unhealthy", r.text
        r = post(url + "/answer", OK)
        assert r.status_code == 503 and r.json()["error"] == "unhealthy", r.text
        for path in ("/readyz", "/healthz"):
            r = httpx.get(url + path)
            assert r.status_code == 503 and r.json() == {"status": "unhealthy"}, path


def test_a_failed_load_says_so_without_internals(onnx_export: Path, caplog) -> None:
    def broken(spec, settings):
        raise RuntimeError("cannot open /secret/models/xlnet/model.onnx")

    with app_server(onnx_export, broken) as (url, _):
        responses = [httpx.get(url + "/readyz"), httpx.get(url + "/healthz"), post(url + "/answer", OK)]
        assert [r.status_code for r in responses] == [503, 503, 503]
        assert responses[0].json() == {"status": "failed"} and responses[2].json()["error"] == "model_failed"
        assert not any("/secret" in r.text for r in responses)
        assert any("/secret" in r.getMessage() for r in caplog.records)  # the operator sees it in the log


def test_request_ids_are_echoed_or_generated(onnx_server: ServerProcess) -> None:
    r = post(onnx_server.url + "/answer", OK, headers={"X-Request-ID": "trace-42.a"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42.a"
    r = post(onnx_server.url + "/answer", {**OK, "top_k": 0}, headers={"X-Request-ID": "bad id with spaces"})
    assert (
        r.status_code == 422 and r.json()["request_id"] == r.headers["x-request-id"] != "bad id with spaces"
    )
    ids = {post(onnx_server.url + "/answer", OK).headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3


# ---- shutdown and worker processes ----------------------------------------------------------------------


def test_shutdown_takes_one_graceful_timeout_in_total(onnx_export: Path, tmp_path: Path, xlnet_tok) -> None:
    """SIGTERM with far more work admitted than fits: waiting for requests and draining the batcher share
    one --graceful-timeout-s (they used to take one each); every client gets an answer or a closed socket."""
    question = "What did the ministers decide?"
    body = {"question": question, "context": long_context(xlnet_tok, question, 100)}
    flags = ("--max-batch-size", "1", "--max-batch-delay-ms", "0", "--graceful-timeout-s", "1.5")
    s = ServerProcess(onnx_export, tmp_path, *flags, "--max-queue", "4096").start()
    results: list = []

    def client() -> None:
        async def fire() -> None:
            limits = httpx.Limits(max_connections=32)
            async with httpx.AsyncClient(base_url=s.url, timeout=60, limits=limits) as c:
                results.extend(
                    await asyncio.gather(
                        *(c.post("/answer", json=body) for _ in range(24)), return_exceptions=True
                    )
                )

        asyncio.run(fire())

    thread = threading.Thread(target=client)
    try:
        thread.start()
        deadline = time.monotonic() + 30
        while sample_total(httpx.get(s.url + "/metrics").text, "xlnetqa_inflight_requests") < 25:
            assert time.monotonic() < deadline, "requests never got in flight"
            time.sleep(0.01)
        assert s.proc is not None
        start = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(30)
        elapsed = time.monotonic() - start
        thread.join(30)
    finally:
        s.stop()
    assert elapsed < 1.5 + 1.2, elapsed  # two timeouts would be 3 s or more
    for r in results:
        if isinstance(r, httpx.Response):
            assert r.status_code in (200, 503), r.text
        else:
            assert isinstance(r, httpx.TransportError), repr(r)
    assert len(results) == 24


def test_workers_share_one_metrics_view_and_a_failed_load_stops_them(
    onnx_export: Path, tmp_path: Path
) -> None:
    s = ServerProcess(onnx_export, tmp_path, "--workers", "2").start()
    try:
        deadline = time.monotonic() + 60
        while sample_total(httpx.get(s.url + "/metrics").text, "xlnetqa_ready") < 2:  # both workers, summed
            assert time.monotonic() < deadline, s.log()
            time.sleep(0.1)
        for _ in range(10):
            with httpx.Client(base_url=s.url) as c:  # a new connection each: the kernel picks the worker
                assert c.post("/answer", json=OK).status_code == 200
        for _ in range(4):  # whichever worker answers /metrics counts every worker's requests
            with httpx.Client(base_url=s.url) as c:
                text = c.get("/metrics").text
            assert sample_total(text, "xlnetqa_requests_total", route="/answer", status="200") == 10
    finally:
        s.stop()
    broken = tmp_path / "broken"
    shutil.copytree(onnx_export, broken)
    (broken / "model.onnx").write_bytes(b"not an onnx model")
    Sidecar.load(broken).save(broken)  # recorded as exported: passes the file checks, fails to load
    b = ServerProcess(broken, tmp_path, "--workers", "2").launch()
    assert b.proc is not None
    try:
        assert b.proc.wait(60) == 1, b.log()
    finally:
        b.stop()
    assert "failed to load" in b.log()


def test_the_default_body_limit_is_what_the_character_limits_admit(onnx_export: Path, tmp_path: Path) -> None:
    """No --max-body-bytes: a request the character limits admit, every character as an escaped surrogate
    pair (12 bytes each), passes the body check; one byte more than the derived limit is refused unread."""
    from server.settings import ServerSettings

    limit = ServerSettings().body_limit
    assert limit < 1024 * 1024  # ~10x below the old 8 MiB
    with ServerProcess(onnx_export, tmp_path) as s:
        context = "\U0001f600" * 20000  # 20,000 characters, the per-context limit
        items = [{"question": "Why?", "context": context}] * 3  # 60,012 characters <= max_normalized_chars
        raw = json.dumps({"items": items}, ensure_ascii=True).encode()  # \ud83d\ude00 per character
        assert len(raw) > 12 * 60000
        r = post(s.url + "/answer/batch", None, raw=raw, timeout=60)
        assert r.status_code == 200 or r.json()["error"] not in ("body_too_large",), r.text[:300]
        over = b'{"question": "a", "context": "' + b"x" * limit + b'"}'
        r = post(s.url + "/answer", None, raw=over, timeout=60)
        assert r.status_code == 413 and r.json()["error"] == "body_too_large"
        assert str(limit) in r.json()["message"]


def test_model_files_that_differ_from_the_export_or_are_links_are_refused(
    onnx_export: Path, tmp_path: Path
) -> None:
    """The sidecar records each served file's sha256: a changed model, or a tokenizer swapped for a
    symbolic link, stops the server before it listens (exit 2, one line); the intact copy serves."""
    import subprocess
    import sys

    from server_helpers import server_env

    from export.runtime.sidecar import Sidecar

    recorded = Sidecar.load(onnx_export).files_sha256 or {}
    assert {"model.onnx", "spiece.model", "tokenizer_config.json"} <= set(recorded)

    def start(model: Path) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "server", "--model", str(model), "--port", str(free_port())]
        return subprocess.run(cmd, env=server_env(), capture_output=True, text=True, timeout=60)

    changed = tmp_path / "changed"
    shutil.copytree(onnx_export, changed)
    data = bytearray((changed / "model.onnx").read_bytes())
    data[-1] ^= 0xFF
    (changed / "model.onnx").write_bytes(bytes(data))
    r = start(changed)
    assert r.returncode == 2 and "model.onnx differs from the exported file" in r.stderr
    linked = tmp_path / "linked"
    shutil.copytree(onnx_export, linked)
    elsewhere = tmp_path / "elsewhere.model"
    shutil.move(linked / "spiece.model", elsewhere)
    (linked / "spiece.model").symlink_to(elsewhere)
    r = start(linked)
    assert r.returncode == 2 and "spiece.model is a symbolic link" in r.stderr
    intact = tmp_path / "intact"
    shutil.copytree(onnx_export, intact)
    with ServerProcess(intact, tmp_path) as s:
        assert post(s.url + "/answer", OK).status_code == 200


def test_slow_headers_and_slow_bodies_do_not_hold_a_connection(onnx_export: Path, tmp_path: Path) -> None:
    """slowloris: headers trickled a byte every 0.2 s are cut off at --header-timeout-s; a body trickled
    after complete headers gets 408 at --body-timeout-s; meanwhile the server answers everyone else."""
    import socket

    flags = ("--header-timeout-s", "1", "--body-timeout-s", "1")
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        slow = socket.create_connection((HOST, s.port), timeout=10)
        start = time.monotonic()
        closed_after = None
        for byte in b"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 100:
            try:
                slow.sendall(bytes([byte]))
            except OSError:  # reset: the server closed it
                closed_after = time.monotonic() - start
                break
            if slow.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":  # orderly close seen
                closed_after = time.monotonic() - start
                break
            time.sleep(0.2)
        slow.close()
        assert closed_after is not None and closed_after < 5, closed_after
        assert post(s.url + "/answer", OK).status_code == 200

        body = json.dumps(OK).encode()
        trickle = socket.create_connection((HOST, s.port), timeout=10)
        head = (
            f"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        trickle.sendall(head + body[:3])
        reply = b""
        trickle.settimeout(10)
        with contextlib.suppress(OSError):
            for byte in body[3:]:
                time.sleep(0.2)
                trickle.sendall(bytes([byte]))
        with contextlib.suppress(OSError):
            while chunk := trickle.recv(65536):
                reply += chunk
        trickle.close()
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b'"body_timeout"' in reply
        assert post(s.url + "/answer", OK).status_code == 200


def test_the_body_deadline_ends_with_the_body_not_with_the_answer(onnx_export: Path, xlnet_tok) -> None:
    """--body-timeout-s bounds receiving the body only: a request whose answer takes longer than it (here
    ~1.2 s of backend time against 0.5 s) is answered, not mistaken for a departed client."""
    question = "What did the ministers decide?"
    big = {"question": question, "context": long_context(xlnet_tok, question, 60)}
    factory = slow_backend(0.02)
    with app_server(onnx_export, factory, max_batch_size=1, max_batch_delay_ms=0, body_timeout_s=0.5) as (
        url,
        _,
    ):
        start = time.monotonic()
        r = httpx.post(url + "/answer", json=big, timeout=30)
        assert r.status_code == 200, r.text[:300]
        assert time.monotonic() - start > 0.5  # the answer did outlast the body deadline
