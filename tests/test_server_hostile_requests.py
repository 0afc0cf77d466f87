"""Hostile requests against real uvicorn on 127.0.0.1: huge and malformed bodies get small errors at once,
expanding Unicode and inputs without tokens are refused before any work, limits count work (tokens,
windows) over the whole request, request ids replace internals, the body limit follows from the
character limits, and clients that send slowly do not hold a connection.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import httpx
from hostile_server import app_server, slow_backend
from paths import SAMPLE_DEV
from server_helpers import OK, WINDOWS, ServerProcess, long_context, post

from harness.server_process import LOOPBACK as HOST
from qa_core.squad import featurize_one
from server.observability.metrics import sample_total

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
    data = json.loads(SAMPLE_DEV.read_text())
    items = [
        {"question": p["qas"][0]["question"], "context": p["context"]}
        for a in data["data"]
        for p in a["paragraphs"]
    ]
    assert post(onnx_server.url + "/answer", readme).status_code == 200
    r = post(onnx_server.url + "/answer/batch", {"items": [readme, *items]})
    assert r.status_code == 200, r.text


def test_request_ids_are_echoed_or_generated(onnx_server: ServerProcess) -> None:
    r = post(onnx_server.url + "/answer", OK, headers={"X-Request-ID": "trace-42.a"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42.a"
    r = post(onnx_server.url + "/answer", {**OK, "top_k": 0}, headers={"X-Request-ID": "bad id with spaces"})
    assert (
        r.status_code == 422 and r.json()["request_id"] == r.headers["x-request-id"] != "bad id with spaces"
    )
    ids = {post(onnx_server.url + "/answer", OK).headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3


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


# ---- slow clients ----------------------------------------------------------------------------------------


def test_slow_headers_and_slow_bodies_do_not_hold_a_connection(onnx_export: Path, tmp_path: Path) -> None:
    """slowloris: headers trickled a byte every 0.2 s are cut off at --header-timeout-s; a body trickled
    after complete headers gets 408 at --body-timeout-s; meanwhile the server answers everyone else."""
    import socket

    flags = ("--header-timeout-s", "1", "--body-timeout-s", "1")
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        slow = socket.create_connection((HOST, s.port), timeout=10)
        headers = b"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 100  # ~30 s of it
        sent, closed = 0, False
        for byte in headers:
            try:
                slow.sendall(bytes([byte]))
            except OSError:  # reset: the server closed it
                closed = True
                break
            sent += 1
            if slow.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":  # orderly close seen
                closed = True
                break
            time.sleep(0.2)
        slow.close()
        assert closed and sent < len(headers), sent  # cut off while the headers were still coming
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
        calls_before = sample_total(httpx.get(url + "/metrics").text, "xlnetqa_batch_size_count")
        r = httpx.post(url + "/answer", json=big, timeout=30)
        assert r.status_code == 200, r.text[:300]
        calls = sample_total(httpx.get(url + "/metrics").text, "xlnetqa_batch_size_count") - calls_before
        assert calls * 0.02 > 0.5, calls  # each call sleeps 0.02 s: the answer outlasted the body deadline
