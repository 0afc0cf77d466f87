"""The client SDK (sync and async) against a live server: typed results, retries on connection errors
and 503 (honouring Retry-After), no retries on 4xx, typed errors, and the README example as written."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from paths import REPO
from server_helpers import ServerProcess, dev_questions, server_env

import clients
from clients import (
    Answer,
    AsyncXLNetQAClient,
    ModelInfo,
    NBestEntry,
    QARequest,
    XLNetQAClient,
    XLNetQAClientError,
    XLNetQAConnectionError,
    XLNetQAError,
    XLNetQARateLimitError,
    XLNetQAResponseError,
    XLNetQAServerError,
    XLNetQATimeoutError,
)
from clients.client import _Policy
from harness.server_process import refusing_port
from server.observability.metrics import sample_total


@pytest.fixture(scope="module")
def server(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(onnx_export, tmp_path_factory.mktemp("logs"))
    try:
        yield s.start()
    finally:
        s.stop()


def _check(a: Answer, context: str) -> None:
    assert isinstance(a, Answer) and 0.0 <= a.no_answer_prob <= 1.0
    if a.is_impossible:
        assert (a.answer, a.start, a.end) == ("", -1, -1)
    else:
        assert context[a.start : a.end] == a.answer


def test_sync_client_typed_results(server: ServerProcess) -> None:
    pairs = dev_questions()[:3]
    with XLNetQAClient(server.url) as qa:
        assert qa.health() and qa.ready()
        info = qa.model_info()
        assert (
            isinstance(info, ModelInfo) and info.head == "shallow" and info.backend == "onnx" and info.ready
        )
        q, c = pairs[0]
        a = qa.answer(q, c, top_k=3, threshold=1.0)
        _check(a, c)
        assert not a.is_impossible and a.has_answer and a.model == "export" and a.timing_ms.total > 0
        assert len(a.n_best) == 3 and all(isinstance(e, NBestEntry) for e in a.n_best)
        assert qa.answer(q, c).n_best == []  # top_k=1: no n_best
        items = [
            pairs[0],
            {"question": pairs[1][0], "context": pairs[1][1]},
            QARequest(question=pairs[2][0], context=pairs[2][1]),
        ]
        batch = qa.answer_batch(items)
        assert len(batch) == 3
        for got, (question, context) in zip(batch, pairs, strict=True):
            _check(got, context)
            single = qa.answer(question, context)
            assert (got.answer, got.start, got.end) == (single.answer, single.start, single.end)


def test_async_client_typed_results(server: ServerProcess) -> None:
    pairs = dev_questions()[:6]

    async def scenario() -> None:
        async with AsyncXLNetQAClient(server.url) as qa:
            assert await qa.health() and await qa.ready()
            assert (await qa.model_info()).max_seq_len == 128
            answers = await asyncio.gather(*(qa.answer(q, c, top_k=2) for q, c in pairs))
            batch = await qa.answer_batch(pairs)
            for a, b, (_, c) in zip(answers, batch, pairs, strict=True):
                _check(a, c)
                assert (a.answer, a.start, a.end) == (b.answer, b.start, b.end) and len(a.n_best) == 2

    asyncio.run(scenario())


def _count(url: str, status: str) -> float:
    return sample_total(
        httpx.get(url + "/metrics").text, "xlnetqa_requests_total", route="/v1/answer", status=status
    )


def test_4xx_is_raised_at_once_without_retries(server: ServerProcess) -> None:
    before = _count(server.url, "422"), _count(server.url, "413")
    with XLNetQAClient(server.url, retries=5, backoff=1.0) as qa:
        with pytest.raises(XLNetQAClientError) as err:
            qa.answer("   ", "some context")  # the shared schema refuses it before sending
        assert err.value.status_code is None and "question must not be empty" in err.value.message
        with pytest.raises(XLNetQAClientError) as err:
            qa.answer("\u200b", "some context")  # valid JSON, but no tokens: only the server can tell
        assert err.value.status_code == 422 and err.value.error == "empty_question"
        with pytest.raises(XLNetQAClientError) as err:
            qa.answer("Why?", "x" * 20001)
        assert err.value.status_code == 413 and "limit" in err.value.message

    async def async_case() -> None:
        async with AsyncXLNetQAClient(server.url, retries=5, backoff=1.0) as qa:
            with pytest.raises(XLNetQAClientError) as aerr:
                await qa.answer("\ufeff", "some context")
            assert aerr.value.status_code == 422 and aerr.value.error == "empty_question"

    asyncio.run(async_case())
    # Each refused request reached the server once (5 retries were allowed): no retry was sent.
    assert _count(server.url, "422") - before[0] == 2 and _count(server.url, "413") - before[1] == 1


def test_unreachable_server_raises_connection_error_after_retries() -> None:
    with refusing_port() as port:
        unreachable(f"http://127.0.0.1:{port.getsockname()[1]}")


def unreachable(url: str) -> None:
    with XLNetQAClient(url, retries=2, backoff=0.01) as qa:
        assert not qa.health() and not qa.ready()
        with pytest.raises(XLNetQAConnectionError) as err:
            qa.answer("Why?", "Because.")
        assert err.value.status_code is None

    async def async_case() -> None:
        async with AsyncXLNetQAClient(url, retries=1, backoff=0.01) as qa:
            with pytest.raises(XLNetQAConnectionError):
                await qa.answer("Why?", "Because.")

    asyncio.run(async_case())


def test_retry_after_is_honoured_with_jitter_and_capped() -> None:
    policy = _Policy("http://127.0.0.1:1", backoff=0.1, max_backoff=2.0)
    hinted = {policy._delay(0, httpx.Response(503, headers={"Retry-After": "1"})) for _ in range(20)}
    assert all(1.0 <= d <= 1.1 for d in hinted) and len(hinted) > 1  # clients do not return in lockstep
    assert policy._delay(0, httpx.Response(503, headers={"Retry-After": "120"})) == 2.0
    assert 0.05 <= policy._delay(0, httpx.Response(503)) <= 0.1  # exponential backoff with jitter
    assert 0.2 <= policy._delay(2, None) <= 0.4


def test_clients_retry_until_the_server_is_up_and_ready(onnx_export: Path, tmp_path: Path) -> None:
    """Both clients start before the server exists (connection refused), then see 503 during warm-up."""
    with refusing_port() as port:  # refused until the server gets it, and nobody else's meanwhile
        retried_until_ready(onnx_export, tmp_path, port)


def retried_until_ready(onnx_export: Path, tmp_path: Path, port: socket.socket) -> None:
    url = f"http://127.0.0.1:{port.getsockname()[1]}"
    question, context = dev_questions()[0]
    results: dict[str, object] = {}
    kw = {"retries": 80, "backoff": 0.05, "max_backoff": 0.2, "timeout": 10.0}

    def sync_client() -> None:
        with XLNetQAClient(url, **kw) as qa:
            results["sync"] = qa.answer(question, context)

    def async_client() -> None:
        async def go() -> None:
            async with AsyncXLNetQAClient(url, **kw) as qa:
                results["async"] = await qa.answer(question, context)

        asyncio.run(go())

    threads = [threading.Thread(target=sync_client), threading.Thread(target=async_client)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the clients are now retrying refused connections
    s = ServerProcess(onnx_export, tmp_path, "--warmup-delay-s", "1.5", listen_socket=port).launch()
    try:
        s.wait("/healthz")
        with XLNetQAClient(url, retries=1, backoff=0.01, max_backoff=0.05) as impatient:
            with pytest.raises(XLNetQAServerError) as err:
                impatient.answer(question, context)
            assert err.value.status_code == 503 and err.value.error == "not_ready"
        for t in threads:
            t.join(30)
        sync_answer, async_answer = results.get("sync"), results.get("async")
        assert isinstance(sync_answer, Answer) and isinstance(async_answer, Answer), results
        assert (sync_answer.answer, sync_answer.start) == (async_answer.answer, async_answer.start)
        assert _count(url, "503") >= 4  # both retried through 503s (plus the impatient client's two)
    finally:
        s.stop()


def test_readme_example_runs_as_written(server: ServerProcess) -> None:
    code = re.search(r"```python\n(.*?)```", clients.__doc__ or "", re.S)
    assert code is not None
    source = code.group(1).replace("http://127.0.0.1:8000", server.url)
    r = subprocess.run(
        [sys.executable, "-c", source], cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "422" in r.stdout and "shallow" in r.stdout


def test_clients_import_only_httpx_and_pydantic() -> None:
    code = (
        "import sys, clients\n"
        "ours = sorted(m for m in sys.modules if m.split('.')[0] in {'qa_core', 'server', 'train', 'export', 'bench', 'torch', "
        "'numpy', 'onnxruntime', 'fastapi'})\n"
        "print(ours)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=server_env(), capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


# ---- the SDK against broken servers: stand-ins for a proxy, a hung process, a version mismatch ---------


@contextmanager
def stub_server(respond: Callable[[BaseHTTPRequestHandler, dict | None], None]) -> Iterator[tuple[str, list]]:
    """An HTTP server on 127.0.0.1 whose every POST/GET is answered by ``respond``; yields (url, bodies seen)."""
    seen: list = []

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            seen.append(body)
            respond(self, body)

        do_GET = do_POST = _handle  # noqa: N815 - http.server's naming

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def _reply(handler: BaseHTTPRequestHandler, status: int, text: str, headers: dict | None = None) -> None:
    payload = text.encode()
    handler.send_response(status)
    for k, v in {"content-type": "application/json", **(headers or {})}.items():
        handler.send_header(k, v)
    handler.send_header("content-length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


TIMING = {"featurize": 0.1, "queue": 0.1, "inference": 1.0, "decode": 0.1, "total": 1.3}
GOOD = {
    "answer": "x",
    "start": 0,
    "end": 1,
    "score": 0.0,
    "no_answer_prob": 0.1,
    "is_impossible": False,
    "model": "stub",
    "timing_ms": TIMING,
}


def test_only_the_options_the_caller_set_are_sent() -> None:
    def respond(h, body) -> None:
        _reply(h, 200, json.dumps({"results": [GOOD]} if h.path == "/v1/answer/batch" else GOOD))

    with stub_server(respond) as (url, seen), XLNetQAClient(url) as qa:
        qa.answer("Why?", "Because.")
        qa.answer("Why?", "Because.", top_k=2, max_answer_len=5)
        qa.answer_batch([("Why?", "Because.")])
    assert seen == [
        {"question": "Why?", "context": "Because."},  # the model's own max_answer_len applies
        {"question": "Why?", "context": "Because.", "top_k": 2, "max_answer_len": 5},
        {"items": [{"question": "Why?", "context": "Because."}]},
    ]


@pytest.mark.parametrize(
    ("status", "text", "content_type"),
    [
        (
            200,
            json.dumps({**GOOD, "no_answer_prob": None}),
            "application/json",
        ),  # a null where a number is due
        (200, "<html>gateway</html>", "text/html"),  # a proxy's page
        (200, json.dumps({"result": []}), "application/json"),  # another API version
    ],
)
def test_a_malformed_response_is_a_clear_sdk_error(status: int, text: str, content_type: str) -> None:
    def respond(h, body) -> None:
        _reply(h, status, text, {"content-type": content_type, "x-request-id": "abc123"})

    with stub_server(respond) as (url, _):
        with XLNetQAClient(url) as qa:
            with pytest.raises(XLNetQAResponseError) as err:
                qa.answer("Why?", "Because.")
            assert "not a valid Answer" in err.value.message and err.value.request_id == "abc123"
            with pytest.raises(XLNetQAResponseError):
                qa.answer_batch([("Why?", "Because.")])

        async def async_case() -> None:
            async with AsyncXLNetQAClient(url) as aqa:
                with pytest.raises(XLNetQAResponseError):
                    await aqa.answer("Why?", "Because.")

        asyncio.run(async_case())


def test_a_hung_server_is_a_timeout_error_not_httpx() -> None:
    """A server that reads the request and never answers: XLNetQATimeoutError, after one attempt."""
    release = threading.Event()

    def respond(h, body) -> None:
        release.wait(30)

    with stub_server(respond) as (url, seen):
        try:
            with XLNetQAClient(url, timeout=0.3, retries=3) as qa:
                with pytest.raises(XLNetQATimeoutError) as err:
                    qa.answer("Why?", "Because.")
                assert isinstance(err.value, XLNetQAError)
            assert len(seen) == 1  # 3 retries were allowed: a timeout is not retried

            async def async_case() -> None:
                async with AsyncXLNetQAClient(url, timeout=0.3) as aqa:
                    with pytest.raises(XLNetQATimeoutError):
                        await aqa.answer("Why?", "Because.")

            asyncio.run(async_case())
            assert len(seen) == 2
        finally:
            release.set()


def test_the_deadline_bounds_all_retries() -> None:
    """A server that always answers 503 with Retry-After 1: many retries allowed, but one deadline."""

    def respond(h, body) -> None:
        _reply(
            h,
            503,
            json.dumps({"error": "overloaded", "message": "busy", "request_id": "r1"}),
            {"Retry-After": "1"},
        )

    with (
        stub_server(respond) as (url, seen),
        XLNetQAClient(url, retries=50, max_backoff=0.2, deadline=1.0) as qa,
        pytest.raises(XLNetQAServerError) as err,
    ):
        qa.answer("Why?", "Because.")
    assert err.value.status_code == 503 and err.value.error == "overloaded" and err.value.request_id == "r1"
    # It did retry, and the deadline ended it: 50 retries of >= 0.2 s each were allowed, not 1 s of them.
    assert 2 <= len(seen) <= 7, len(seen)


def test_the_deadline_holds_against_a_server_that_trickles_its_answer() -> None:
    """Headers at once, then the body byte by byte over 2 s: every read is within ``timeout``, but the
    call must end at its deadline (sync: checked after each chunk; async: cancelled), while the body
    is still on its way."""
    payload = json.dumps(GOOD).encode() + b" " * 30
    sent: list[int] = []  # one entry per response whose body was sent whole

    def respond(h, body) -> None:
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(payload)))
        h.end_headers()
        for byte in payload:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(2.0 / len(payload))
        sent.append(len(payload))

    def ask_sync(url: str) -> None:
        with XLNetQAClient(url, timeout=2.0, deadline=0.8) as qa:
            qa.answer("Why?", "Because.")

    async def ask_async(url: str) -> None:
        async with AsyncXLNetQAClient(url, timeout=2.0, deadline=0.8) as qa:
            await qa.answer("Why?", "Because.")

    with stub_server(respond) as (url, _):
        for ask in (lambda: ask_sync(url), lambda: asyncio.run(ask_async(url))):
            with pytest.raises(XLNetQATimeoutError, match="deadline"):
                ask()
            assert sent == []  # the deadline ended the call, not the end of the body
        with XLNetQAClient(url, timeout=2.0, deadline=30) as qa:  # a deadline that holds: the answer
            assert qa.answer("Why?", "Because.").answer == "x"


def test_bad_arguments_are_sdk_errors_before_anything_is_sent() -> None:
    with (
        stub_server(lambda h, body: _reply(h, 200, json.dumps(GOOD))) as (url, seen),
        XLNetQAClient(url) as qa,
    ):
        bad_calls = [
            lambda: qa.answer("Why?", "Because.", threshold=float("nan")),
            lambda: qa.answer("Why?", 3),  # type: ignore[arg-type]
            lambda: qa.answer_batch([("only a question",)]),  # type: ignore[list-item]
            lambda: qa.answer_batch([{"question": "Why?", "context": "Because.", "max_answer_length": 3}]),
        ]
        for call in bad_calls:
            with pytest.raises(XLNetQAClientError) as err:
                call()
            assert err.value.status_code is None and err.value.message
    assert seen == []


def test_the_sdk_and_the_server_share_one_schema(server) -> None:
    """The SDK's request item is the server's request model; its results are the server's response
    models with the same fields and types (only ``n_best`` is a list where the server omits it); and the
    live server documents exactly those fields in its OpenAPI schema."""
    from clients import schema
    from server.api import schemas

    assert QARequest is schemas.AnswerRequest is schema.AnswerRequest
    for sdk, wire in (
        (Answer, schema.AnswerResponse),
        (ModelInfo, schema.ModelInfoResponse),
        (NBestEntry, schema.NBestEntry),
        (clients.Timing, schema.Timing),
    ):
        assert issubclass(sdk, wire) and sdk.model_fields.keys() == wire.model_fields.keys(), sdk
        for name, field in wire.model_fields.items():
            if (sdk, name) != (Answer, "n_best"):
                assert sdk.model_fields[name].annotation == field.annotation, (sdk, name)
    documented = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]
    for wire in (
        schema.AnswerRequest,
        schema.AnswerResponse,
        schema.NBestEntry,
        schema.Timing,
        schema.ErrorResponse,
    ):
        doc = documented[wire.__name__]
        assert set(doc["properties"]) == set(wire.model_fields), wire
        required = {n for n, f in wire.model_fields.items() if f.is_required()}
        assert set(doc.get("required", [])) >= required, wire


@pytest.mark.parametrize("hint", ["43000", "1e12", "inf", "nan", "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_a_429_with_a_long_or_absurd_retry_after_is_raised_at_once(hint: str) -> None:
    """A daily quota used up (Retry-After: hours) or a hostile header is the caller's error to see at
    once, never hours of sleep or a raw OverflowError."""

    def respond(h, body) -> None:
        body = {"error": "rate_limited", "message": "the daily quota is used up", "request_id": "q1"}
        _reply(h, 429, json.dumps(body), {"Retry-After": hint})

    with stub_server(respond) as (url, seen), XLNetQAClient(url, retries=5, max_backoff=2.0) as qa:
        start = time.monotonic()
        with pytest.raises(XLNetQARateLimitError) as err:
            qa.answer("Why?", "Because.")
        assert time.monotonic() - start < 2.0 and len(seen) == 1
        assert isinstance(err.value, XLNetQAError) and err.value.error == "rate_limited"


def test_every_call_has_a_deadline_by_default() -> None:
    from clients.client import DEFAULT_DEADLINE_S

    with XLNetQAClient("http://127.0.0.1:9") as qa:
        assert qa.deadline == DEFAULT_DEADLINE_S > 0
    with XLNetQAClient("http://127.0.0.1:9", deadline=None) as qa:  # none only when asked for
        assert qa.deadline is None


@pytest.mark.parametrize("url", ["http://example.com", "http://10.0.0.5:8000", "http://[2001:db8::1]:8000"])
def test_a_key_is_never_sent_in_clear_text_beyond_loopback(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="clear text") as err:
        XLNetQAClient(url, api_key="k" * 32)
    assert "k" * 32 not in str(err.value)
    monkeypatch.setenv("XLNETQA_API_KEY", "e" * 32)  # a key from the environment too
    with pytest.raises(ValueError, match="allow_insecure_http"):
        AsyncXLNetQAClient(url)
    XLNetQAClient(url, allow_insecure_http=True).close()  # said so: the caller's call
    XLNetQAClient(url.replace("http://", "https://")).close()
    for local in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000"):
        XLNetQAClient(local).close()
