"""The HTTP server against real uvicorn on 127.0.0.1: answers, batching, errors, readiness, metrics,
overload, graceful shutdown, backend agreement and the torch-free import rule.

Models are tiny random XLNets, so answers are arbitrary: tests check invariants (offsets, ranges,
order, agreement with in-process decoding), never answer quality. Helpers: ``server_helpers``;
fixtures (the model, its export, the servers): ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from paths import REPO
from server_helpers import (
    OK,
    WINDOWS,
    ServerProcess,
    check_answer,
    dev_questions,
    long_context,
    post,
    server_env,
)

from qa_core.runtime.backends import SERVER_BACKENDS
from qa_core.squad import DecodeOptions, decode, featurize_one
from qa_core.tokenizer import XLNetTokenizer
from server.observability.metrics import sample_total

# ---- answers -----------------------------------------------------------------------------------------


def test_answer_invariants_and_top_k(onnx_server: ServerProcess) -> None:
    for question, context in dev_questions()[:6]:
        r = post(onnx_server.url + "/answer", {"question": question, "context": context, "threshold": 1.0})
        assert r.status_code == 200, r.text
        body = r.json()
        check_answer(body, context)
        assert not body["is_impossible"] and body["model"] == "export"
        r = post(onnx_server.url + "/answer", {"question": question, "context": context, "top_k": 5})
        check_answer(r.json(), context, top_k=5)
        assert len(r.json()["n_best"]) == 5


def test_impossible_answers_are_empty_with_minus_one_offsets(onnx_server: ServerProcess) -> None:
    question, context = dev_questions()[0]
    body = post(
        onnx_server.url + "/answer", {"question": question, "context": context, "threshold": 0.0}
    ).json()
    assert body["is_impossible"] and (body["answer"], body["start"], body["end"]) == ("", -1, -1)
    assert body["score"] is not None  # spans exist; the threshold decided


def test_long_context_matches_in_process_decoding(
    onnx_server: ServerProcess,
    onnx_export: Path,
    xlnet_tok: XLNetTokenizer,
) -> None:
    import onnxruntime as ort

    question = "What happened to the price of oil?"
    context = long_context(xlnet_tok, question, min_windows=3)
    features = featurize_one(question, context, xlnet_tok, **WINDOWS)
    assert len(features) > 3
    session = ort.InferenceSession(str(onnx_export / "model.onnx"), providers=["CPUExecutionProvider"])
    outs = []
    for f in features:  # one unpadded window at a time: independent of the server's batching
        feeds = {"input_ids": f.input_ids[None], "attention_mask": f.attention_mask[None]}
        feeds["token_type_ids"] = f.token_type_ids[None]
        outs.append(session.run(["start_logits", "end_logits", "cls_logits"], feeds))
    starts, ends = [o[0][0] for o in outs], [o[1][0] for o in outs]
    cls = np.array([o[2][0] for o in outs])
    for threshold in (0.5, 1.0):
        want = decode(context, features, starts, ends, cls, DecodeOptions.spans(20, 30, threshold))
        body = post(
            onnx_server.url + "/answer",
            {"question": question, "context": context, "top_k": 20, "threshold": threshold},
        ).json()
        check_answer(body, context, top_k=20)
        assert (body["answer"], body["start"], body["end"]) == (want.text, want.start, want.end)
        assert body["no_answer_prob"] == pytest.approx(want.no_answer_prob, abs=1e-5)
        assert [(e["start"], e["end"]) for e in body["n_best"]] == [(e.start, e.end) for e in want.n_best]
    # Candidates come from every window, not only the first.
    first_window_end = int(features[0].token_to_char[features[0].paragraph_len - 1, 1])
    assert any(e["start"] >= first_window_end for e in body["n_best"])


def test_onnx_and_torch_backends_agree(
    onnx_server: ServerProcess, torch_server: ServerProcess, xlnet_tok
) -> None:
    q = "Who was the president?"
    cases = [*dev_questions()[:4], (q, long_context(xlnet_tok, q, 3))]
    for question, context in cases:
        body = {"question": question, "context": context, "top_k": 5, "threshold": 1.0}
        a = post(onnx_server.url + "/answer", body).json()
        b = post(torch_server.url + "/answer", body).json()
        assert (a["answer"], a["start"], a["end"]) == (b["answer"], b["start"], b["end"])
        assert a["no_answer_prob"] == pytest.approx(b["no_answer_prob"], abs=1e-4)
        assert [e["text"] for e in a["n_best"]] == [e["text"] for e in b["n_best"]]
        for x, y in zip(a["n_best"], b["n_best"], strict=True):
            assert x["score"] == pytest.approx(y["score"], abs=1e-3)
    info = httpx.get(torch_server.url + "/v1/model").json()
    assert info["backend"] == "torch" and info["head"] == "shallow" and info["max_seq_len"] == 128


def test_batch_endpoint_matches_single_calls_in_order(onnx_server: ServerProcess, xlnet_tok) -> None:
    q = "When did it begin?"
    items = [{"question": qq, "context": c, "top_k": 3} for qq, c in dev_questions()[:5]]
    items += [{"question": q, "context": long_context(xlnet_tok, q, 3)}]
    r = post(onnx_server.url + "/answer/batch", {"items": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == len(items)
    for item, got in zip(items, results, strict=True):
        single = post(onnx_server.url + "/answer", item).json()
        check_answer(got, item["context"], item.get("top_k", 1))
        assert (got["answer"], got["start"], got["end"]) == (single["answer"], single["start"], single["end"])
        assert got["no_answer_prob"] == pytest.approx(single["no_answer_prob"], abs=1e-5)


def test_one_version_prefix_and_the_old_paths_name_their_successor(onnx_server: ServerProcess) -> None:
    """Every route is under /v1; /answer and /answer/batch (before the prefix) answer the same, marked
    deprecated in the schema, each response naming its successor."""
    current = httpx.post(onnx_server.url + "/v1/answer", json=OK, timeout=30)
    old = httpx.post(onnx_server.url + "/answer", json=OK, timeout=30)
    assert current.status_code == old.status_code == 200
    assert {k: current.json()[k] for k in ("answer", "start", "end")} == {
        k: old.json()[k] for k in ("answer", "start", "end")
    }
    assert "deprecation" not in current.headers
    assert (
        old.headers["deprecation"] == "true"
        and old.headers["link"] == '</v1/answer>; rel="successor-version"'
    )
    batch = httpx.post(onnx_server.url + "/answer/batch", json={"items": [OK]}, timeout=30)
    assert batch.status_code == 200 and batch.headers["link"] == '</v1/answer/batch>; rel="successor-version"'
    paths = httpx.get(onnx_server.url + "/openapi.json").json()["paths"]
    assert {p for p in paths if not p.startswith("/v1/")} == {
        "/answer",
        "/answer/batch",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    assert paths["/answer"]["post"]["deprecated"] and not paths["/v1/answer"]["post"].get("deprecated")


def test_concurrent_requests_are_micro_batched(onnx_server: ServerProcess) -> None:
    before = httpx.get(onnx_server.url + "/metrics").text
    pairs = [(q, c[:150]) for q, c in dev_questions()[:24]]  # one window each: grouping is across requests

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=onnx_server.url, timeout=30) as c:
            return await asyncio.gather(
                *(c.post("/answer", json={"question": q, "context": x}) for q, x in pairs)
            )

    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses)
    for r, (_, context) in zip(responses, pairs, strict=True):
        check_answer(r.json(), context)
    after = httpx.get(onnx_server.url + "/metrics").text
    windows = sample_total(after, "xlnetqa_batch_size_sum") - sample_total(before, "xlnetqa_batch_size_sum")
    calls = sample_total(after, "xlnetqa_batch_size_count") - sample_total(before, "xlnetqa_batch_size_count")
    assert windows == len(pairs) and calls < windows  # several requests per backend call


# ---- errors ------------------------------------------------------------------------------------------

BAD_INPUTS = [
    ("empty question", "/answer", {**OK, "question": ""}, None, 422, "validation_error"),
    ("whitespace question", "/answer", {**OK, "question": " \t\n"}, None, 422, "validation_error"),
    ("question without tokens", "/answer", {**OK, "question": "\u200b"}, None, 422, "empty_question"),
    ("empty context", "/answer", {**OK, "context": ""}, None, 422, "empty_context"),
    ("context without tokens", "/answer", {**OK, "context": "\u200b\u200d "}, None, 422, "empty_context"),
    ("context too large", "/answer", {**OK, "context": "x" * 20001}, None, 413, "context_too_large"),
    ("question too large", "/answer", {**OK, "question": "q" * 1001}, None, 413, "question_too_large"),
    ("question not a string", "/answer", {**OK, "question": 123}, None, 422, "validation_error"),
    ("top_k as a string", "/answer", {**OK, "top_k": "3"}, None, 422, "validation_error"),
    ("top_k zero", "/answer", {**OK, "top_k": 0}, None, 422, "validation_error"),
    ("top_k too large", "/answer", {**OK, "top_k": 21}, None, 422, "validation_error"),
    ("threshold above one", "/answer", {**OK, "threshold": 1.5}, None, 422, "validation_error"),
    ("unknown field", "/answer", {**OK, "max_answer_length": 3}, None, 422, "validation_error"),
    ("missing context", "/answer", {"question": "What?"}, None, 422, "validation_error"),
    ("body not an object", "/answer", [1, 2], None, 422, "validation_error"),
    ("lone surrogate", "/answer", None, b'{"question": "a\\ud800", "context": "b"}', 422, "validation_error"),
    ("NaN threshold", "/answer", None, b'{"question": "a", "context": "b", "threshold": NaN}', 422, "validation_error"),
    ("non-UTF-8 body", "/answer", None, b'{"question": "\xff\xfe", "context": "b"}', 400, "invalid_utf8"),
    ("invalid JSON", "/answer", None, b'{"question": "a", ', 400, "invalid_json"),
    ("deeply nested JSON", "/answer", None, b"[" * 100_000 + b"]" * 100_000, 400, "bad_request"),
    ("empty body", "/answer", None, b"", 422, "validation_error"),
    ("form content type", "/answer", None, b"question=a&context=b", 415, "unsupported_media_type"),
    ("body too large", "/answer", None, b'{"question": "a", "context": "' + b"x" * 1_000_001 + b'"}', 413, "body_too_large"),
    ("too many batch items", "/answer/batch", {"items": [OK] * 33}, None, 413, "too_many_items"),
    ("empty batch", "/answer/batch", {"items": []}, None, 422, "validation_error"),
    ("items not a list", "/answer/batch", {"items": OK}, None, 422, "validation_error"),
    ("bad batch item", "/answer/batch", {"items": [OK, {**OK, "question": " "}]}, None, 422, "validation_error"),
    ("batch item without tokens", "/answer/batch", {"items": [OK, {**OK, "context": "\ufeff"}]}, None, 422, "empty_context"),
    ("batch item too large", "/answer/batch", {"items": [OK, {**OK, "context": "x" * 20001}]}, None, 413, "context_too_large"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "path", "body", "raw", "status", "kind"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_gets_a_clear_json_error(
    onnx_server: ServerProcess, case, path, body, raw, status, kind
) -> None:
    headers = {"content-type": "application/x-www-form-urlencoded"} if case == "form content type" else None
    r = post(onnx_server.url + path, body, raw=raw, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["error"] == kind and isinstance(err["message"], str) and len(err["message"]) > 5
    assert err["request_id"] == r.headers["x-request-id"] and len(err["request_id"]) >= 16
    if status == 422 and kind == "validation_error":
        assert err["details"] and all({"loc", "msg", "type"} <= set(d) for d in err["details"])
    if case == "whitespace question":
        assert "question must not be empty" in err["message"]
    if status == 413:  # the limit and the setting that sets it
        assert re.search(r"\((max_\w+)\)", err["message"]), err["message"]


def test_chunked_body_over_the_limit_is_413(onnx_server: ServerProcess) -> None:
    def chunks():
        yield b'{"question": "a", "context": "'
        for _ in range(12):
            yield b"x" * 100_000
        yield b'"}'

    r = httpx.post(
        onnx_server.url + "/answer", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    assert post(onnx_server.url + "/answer", OK).status_code == 200


def test_a_client_uploading_a_body_far_over_the_limit_reads_the_413(onnx_server: ServerProcess) -> None:
    """9x the limit, more than the socket buffers hold: the server reads and discards the rest, so the
    client gets the JSON 413 instead of a connection reset mid-upload."""
    from clients import XLNetQAClient, XLNetQAClientError

    raw = b'{"question": "a", "context": "' + b"x" * 9_000_000 + b'"}'
    r = post(onnx_server.url + "/answer", None, raw=raw)
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"

    async def upload() -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as c:
            return await c.post(
                onnx_server.url + "/answer", content=raw, headers={"content-type": "application/json"}
            )

    r = asyncio.run(upload())
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    with XLNetQAClient(onnx_server.url, retries=3) as qa, pytest.raises(XLNetQAClientError) as err:
        qa.answer("a", "x" * 9_000_000)  # not retried as a connection error
    assert err.value.status_code == 413 and err.value.error == "body_too_large"


def test_unknown_route_and_method_are_json(onnx_server: ServerProcess) -> None:
    r = httpx.get(onnx_server.url + "/nope")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = httpx.get(onnx_server.url + "/answer")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert httpx.get(onnx_server.url + "/healthz").json() == {"status": "ready"}


# ---- metadata, docs, metrics ------------------------------------------------------------------------


def test_model_info_docs_and_openapi(onnx_server: ServerProcess) -> None:
    info = httpx.get(onnx_server.url + "/v1/model").json()
    assert info["head"] == "shallow" and info["backend"] == "onnx" and info["precision"] == "fp32"
    assert (info["max_seq_len"], info["doc_stride"], info["max_query_len"]) == (128, 64, 32)
    assert info["no_answer_threshold"] == 0.5 and info["ready"] is True
    assert (
        info["runtime"]["providers"] == ["CPUExecutionProvider"] and info["runtime"]["intra_op_threads"] == 1
    )
    assert info["batching"]["max_batch_size"] == 8 and info["limits"]["max_context_chars"] == 20000
    assert "text/html" in httpx.get(onnx_server.url + "/docs").headers["content-type"]
    spec = httpx.get(onnx_server.url + "/openapi.json").json()
    assert {"/answer", "/answer/batch", "/healthz", "/readyz", "/metrics", "/v1/model"} <= set(spec["paths"])
    assert {"413", "422", "503"} <= set(spec["paths"]["/answer"]["post"]["responses"])


def test_each_answer_names_the_model_rule_that_decided_it() -> None:
    """``rule`` in an answer, for the model's own rules (a request's or the server's threshold replaces
    them: tests/test_playground.py asks real servers for those)."""
    from dataclasses import replace

    from qa_core.squad.answerability import Answerability, Linear
    from server.answering.model_spec import decision_rule

    fitted = Answerability(
        Linear(("cls_logit",), (0.0,), (1.0,), (-1.0,), 0.0), threshold=0.3, report={"beats_no_answer": True}
    )
    never = replace(fitted, threshold=0.0, report={"beats_no_answer": False})  # how fitting stores "none"
    rules = [Answerability.cls_only(0.5), fitted, replace(fitted, rule="expected_gain"), never]
    assert [decision_rule(a) for a in rules] == ["cls", "threshold", "expected_gain", "none"]


def test_an_answer_says_why_it_answered_or_abstained(onnx_server: ServerProcess) -> None:
    """``reason`` states the rule's inputs (P(no answer) against the threshold and who set it), ``margin``
    is threshold - P(no answer), its sign the decision; the SDK's type reads the same fields."""
    from clients import XLNetQAClient

    for threshold, answered in ((1.0, True), (0.0, False)):
        body = post(onnx_server.url + "/v1/answer", {**OK, "threshold": threshold}).json()
        assert body["is_impossible"] is not answered and body["rule"] == "request"
        assert body["margin"] == pytest.approx(body["threshold"] - body["no_answer_prob"])
        assert (body["margin"] >= 0) is answered and body["expected_f1"] is None
        verdict, sign = ("answered", "<=") if answered else ("no answer", ">")
        assert body["reason"] == (
            f"{verdict}: P(no answer) {body['no_answer_prob']:.2f} {sign} threshold {threshold:.2f} (set by the request)"
        )
    with XLNetQAClient(onnx_server.url) as client:
        result = client.answer(OK["question"], OK["context"], threshold=0.0)
    assert result.is_impossible and result.reason and result.reason.startswith("no answer: P(no answer)")
    assert result.margin is not None and result.margin < 0


def test_metrics_count_requests_errors_latency_and_batches(onnx_server: ServerProcess) -> None:
    post(onnx_server.url + "/answer", OK)
    post(onnx_server.url + "/answer", {**OK, "question": ""})
    text = httpx.get(onnx_server.url + "/metrics").text
    assert sample_total(text, "xlnetqa_requests_total", route="/answer", status="200") >= 1
    assert sample_total(text, "xlnetqa_requests_total", route="/answer", status="422") >= 1
    assert sample_total(text, "xlnetqa_errors_total", kind="validation_error") >= 1
    assert sample_total(text, "xlnetqa_request_duration_seconds_count", route="/answer") >= 2
    assert 'xlnetqa_request_duration_seconds_bucket{le="0.005",route="/answer"}' in text
    for name in (
        "xlnetqa_batch_size_count",
        "xlnetqa_queue_time_seconds_count",
        "xlnetqa_inference_seconds_count",
    ):
        assert sample_total(text, name) >= 1, name
    assert sample_total(text, "xlnetqa_ready") == 1
    assert sample_total(text, "xlnetqa_model_info", backend="onnx", head="shallow") == 1


# ---- lifecycle ---------------------------------------------------------------------------------------


def test_readyz_is_503_until_warmed_up(onnx_export: Path, tmp_path: Path) -> None:
    s = ServerProcess(onnx_export, tmp_path, "--warmup-delay-s", "2").launch()
    try:
        s.wait("/healthz")
        r = httpx.get(s.url + "/readyz")
        assert (
            r.status_code == 503 and r.json()["status"] in ("loading", "warming") and r.headers["retry-after"]
        )
        r = post(s.url + "/answer", OK)
        assert r.status_code == 503 and r.json()["error"] == "not_ready" and r.headers["retry-after"] == "1"
        s.wait("/readyz", timeout=30)
        assert post(s.url + "/answer", OK).status_code == 200
    finally:
        s.stop()


def _slow_requests(tok: XLNetTokenizer, n: int) -> list[dict]:
    """Requests of many windows each, so that n of them keep a no-batching server busy for a while."""
    question = "What did the ministers decide?"
    context = long_context(tok, question, min_windows=60)
    return [{"question": question, "context": context} for _ in range(n)]


def test_full_queue_answers_503_with_retry_after(onnx_export: Path, tmp_path: Path, xlnet_tok) -> None:
    bodies = _slow_requests(xlnet_tok, 16)
    windows = len(featurize_one(bodies[0]["question"], bodies[0]["context"], xlnet_tok, **WINDOWS))
    flags = (  # the queue holds the windows of two requests
        "--max-queue",
        str(2 * windows + 1),
        "--max-request-windows",
        str(windows),
        "--max-batch-size",
        "1",
        "--max-batch-delay-ms",
        "0",
    )
    s = ServerProcess(onnx_export, tmp_path, *flags).start()
    try:

        async def fire() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=32)
            async with httpx.AsyncClient(base_url=s.url, timeout=60, limits=limits) as c:
                return await asyncio.gather(*(c.post("/answer", json=b) for b in bodies))

        responses = asyncio.run(fire())
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 503} and codes.count(503) >= 1 and codes.count(200) >= 2, codes
        for r in responses:
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1" and r.json()["error"] == "overloaded"
        assert post(s.url + "/answer", OK).status_code == 200  # the server recovered
        text = httpx.get(s.url + "/metrics").text
        assert sample_total(text, "xlnetqa_errors_total", kind="overloaded") == codes.count(503)
    finally:
        s.stop()


def test_sigterm_finishes_in_flight_requests(onnx_export: Path, tmp_path: Path, xlnet_tok) -> None:
    s = ServerProcess(onnx_export, tmp_path, "--max-batch-size", "1", "--max-batch-delay-ms", "0").start()
    bodies = _slow_requests(xlnet_tok, 8)
    results: list[httpx.Response | BaseException] = []

    def client() -> None:
        async def fire() -> None:
            async with httpx.AsyncClient(
                base_url=s.url, timeout=60, limits=httpx.Limits(max_connections=16)
            ) as c:
                results.extend(
                    await asyncio.gather(*(c.post("/answer", json=b) for b in bodies), return_exceptions=True)
                )

        asyncio.run(fire())

    thread = threading.Thread(target=client)
    try:
        thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # all 8 admitted (+1: the /metrics request itself)
            if (
                sample_total(httpx.get(s.url + "/metrics").text, "xlnetqa_inflight_requests")
                >= len(bodies) + 1
            ):
                break
            time.sleep(0.01)
        else:
            pytest.fail("requests never got in flight")
        assert s.proc is not None
        s.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        rc = s.proc.wait(30)
    finally:
        s.stop()
    assert [getattr(r, "status_code", r) for r in results] == [200] * len(bodies)
    # uvicorn re-raises the captured SIGTERM after its graceful shutdown, so the exit reports the signal.
    assert rc in (0, -signal.SIGTERM), s.log()
    with pytest.raises(httpx.ConnectError):
        httpx.get(s.url + "/healthz")


# ---- startup errors and the torch-free rule ---------------------------------------------------------


def _run_server_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "server", *args]
    return subprocess.run(cmd, cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=60)


def test_unusable_model_or_backend_exits_2_with_one_line(onnx_export: Path, tmp_path: Path) -> None:
    r = _run_server_cli("--model", str(tmp_path / "missing"), "--port", "0")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "not found" in r.stderr
    r = _run_server_cli("--model", str(onnx_export), "--max-batch-size", "0")
    assert r.returncode == 2 and "max_batch_size" in r.stderr and r.stderr.strip().count("\n") == 0
    broken = tmp_path / "broken"
    shutil.copytree(onnx_export, broken)
    (broken / "model.onnx").write_bytes(b"not an onnx model")
    r = _run_server_cli("--model", str(broken), "--port", "0", "--log-level", "critical")
    assert r.returncode == 2 and "model.onnx differs from the exported file" in r.stderr, r.stderr
    from qa_core.runtime.sidecar import Sidecar

    Sidecar.load(broken).save(broken)  # as if the exporter had written it: passes the checks, fails to load
    r = _run_server_cli("--model", str(broken), "--port", "0", "--log-level", "critical")  # any free port
    assert r.returncode == 1 and "model failed to load" in r.stderr, r.stderr
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        r = _run_server_cli("--model", str(onnx_export), "--backend", "trt")
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "tensorrt" in r.stderr, r.stderr


TORCH_FREE_SCRIPT = """
import socket, sys, threading, time, httpx, uvicorn
from server.flags import load_settings
from server.app import create_app
listening = socket.create_server(("127.0.0.1", 0))
port = str(listening.getsockname()[1])
settings = load_settings(["--model", sys.argv[1], "--backend", "onnx", "--port", port])
server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=settings.port, log_level="error"))
thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}); thread.start()
url = f"http://127.0.0.1:{settings.port}"
for _ in range(600):
    try:
        if httpx.get(url + "/readyz").status_code == 200: break
    except httpx.HTTPError: pass
    time.sleep(0.05)
r = httpx.post(url + "/answer", json={"question": "What?", "context": "Something happened.", "top_k": 2})
assert r.status_code == 200, r.text
server.should_exit = True; thread.join()
import clients
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "train.model", "train.model.checkpoint")))
print("LEAKED" if bad else "TORCH-FREE", bad)
"""


def test_onnx_server_never_imports_torch(onnx_export: Path) -> None:
    cmd = [sys.executable, "-c", TORCH_FREE_SCRIPT, str(onnx_export)]
    r = subprocess.run(cmd, cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "TORCH-FREE []" in r.stdout, r.stdout + r.stderr


# ---- settings -----------------------------------------------------------------------------------------


def test_switches_and_choices_read_as_the_other_commands_do() -> None:
    """A boolean setting is a switch (``--x`` on, ``--no-x`` off; ``--x false`` as before) and a setting
    with a fixed set of values lists them in --help and refuses others (vLLM's and HF's conventions)."""
    from server.flags import FlagError, build_parser, load_settings

    assert load_settings(["--no-playground"]).playground is False
    assert load_settings(["--playground"]).playground is True
    assert load_settings(["--playground", "false"]).playground is False
    text = build_parser().format_help()
    assert "--playground, --no-playground" in text and f"--backend {{{','.join(SERVER_BACKENDS)}}}" in text
    bad = {
        ("--no-playground", "true"): "playground: --no-playground takes no value",
        ("--backend", "bogus"): "backend: invalid choice 'bogus'",
        ("--batching", "sometimes"): "batching: invalid choice 'sometimes'",
    }
    for flags, says in bad.items():
        with pytest.raises(FlagError, match=re.escape(says)):
            build_parser().parse_args(list(flags))
    r = _run_server_cli("--model", "x", "--backend", "bogus")  # the command: one line, exit 2
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: backend: invalid choice 'bogus' (choose from {', '.join(map(repr, SERVER_BACKENDS))})"
    ], r.stderr


def test_settings_from_env_overridden_by_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from server.flags import load_settings

    monkeypatch.setenv("XLNETQA_MAX_QUEUE", "77")
    monkeypatch.setenv("XLNETQA_MAX_REQUEST_WINDOWS", "60")
    monkeypatch.setenv("XLNETQA_THREADS", "3")
    monkeypatch.setenv("XLNETQA_BACKEND", "torch")
    s = load_settings(["--threads", "2", "--max-batch-delay-ms", "0"])
    assert (s.max_queue, s.threads, s.backend, s.max_batch_delay_ms) == (77, 2, "torch", 0.0)
    assert s.to_env()["XLNETQA_MAX_QUEUE"] == "77"
