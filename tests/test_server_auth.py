"""Who may ask: API keys, rotation, per-key limits, the access log, TLS and the SDK's side of them,
each against a real ``python -m server`` on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from auth_helpers import ALICE, BOB, CAROL, WRONG, bearer, keys_file, until
from server_helpers import OK, WINDOWS, ServerProcess, access_lines, long_context, post

from clients import XLNetQAAuthenticationError, XLNetQAClient, XLNetQAConnectionError, XLNetQARateLimitError
from harness.certificates import make_certificates
from qa_core.squad import featurize_one
from server.app import create_app, open_paths
from server.observability.metrics import sample_total
from server.settings import ServerSettings


@pytest.fixture(scope="module")
def keyed_server(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("auth-logs")
    keys = keys_file(logs / "keys.txt", f"alice: {ALICE}", f"bob:{BOB}")
    flags = ["--api-keys-file", str(keys), "--auth-failures-per-minute", "100000"]  # this module fails a lot
    with ServerProcess(onnx_export, logs, *flags, log_level="info") as s:
        yield s


def protected_routes(onnx_export: Path) -> list[tuple[str, str]]:
    """(method, path) of every route the app has that the door does not leave open."""
    settings = ServerSettings(model=onnx_export)
    app = create_app(settings)
    opened = open_paths(settings)

    def walk(routes):  # FastAPI keeps included routers as one entry each
        for route in routes:
            inner = getattr(route, "original_router", None)
            yield from walk(inner.routes) if inner is not None else [route]

    out = []
    for route in walk(app.routes):
        path = getattr(route, "path", "")
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD" and path not in opened and "{" not in path:
                out.append((method, path))
    return out


def test_every_protected_route_needs_a_key_and_the_probes_do_not(keyed_server, onnx_export):
    routes = protected_routes(onnx_export)
    paths = {p for _, p in routes}
    assert {
        "/v1/answer",
        "/v1/answer/batch",
        "/answer",
        "/answer/batch",
        "/metrics",
        "/v1/model",
        "/docs",
    } <= paths
    for method, path in routes:
        body = {"items": [OK]} if path.endswith("/answer/batch") else OK
        kw = {"json": body} if method == "POST" else {}
        none = httpx.request(method, keyed_server.url + path, timeout=30, **kw)
        wrong = httpx.request(method, keyed_server.url + path, headers=bearer(WRONG), timeout=30, **kw)
        right = httpx.request(method, keyed_server.url + path, headers=bearer(ALICE), timeout=30, **kw)
        as_header = httpx.request(
            method, keyed_server.url + path, headers={"X-API-Key": BOB}, timeout=30, **kw
        )
        for r in (none, wrong):
            assert r.status_code == 401, (method, path, r.status_code)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"] == "unauthorized"
        # the same answer whether the key was missing or wrong: nothing says which
        assert {k: v for k, v in none.json().items() if k != "request_id"} == {
            k: v for k, v in wrong.json().items() if k != "request_id"
        }
        assert right.status_code == 200 and as_header.status_code == 200, (method, path)
    for path in ("/healthz", "/readyz", "/", "/playground/app.js"):
        assert httpx.get(keyed_server.url + path, timeout=10).status_code == 200, path
    # an unknown path tells an unauthenticated caller nothing (401, not 404)
    assert httpx.get(keyed_server.url + "/admin", timeout=10).status_code == 401
    assert httpx.get(keyed_server.url + "/admin", headers=bearer(ALICE), timeout=10).status_code == 404
    assert "server" not in httpx.get(keyed_server.url + "/healthz", timeout=10).headers


def test_metrics_count_per_key_name_and_the_log_holds_neither_keys_nor_text(keyed_server):
    secret_question = "Which secret zebra question is this?"
    for _ in range(3):
        r = post(keyed_server.url + "/answer", {**OK, "question": secret_question}, headers=bearer(BOB))
        assert r.status_code == 200
    assert post(keyed_server.url + "/answer", OK, headers=bearer(WRONG)).status_code == 401
    text = httpx.get(keyed_server.url + "/metrics", headers=bearer(ALICE), timeout=10).text
    assert sample_total(text, "xlnetqa_key_requests_total", key="bob", status="200") >= 3
    assert sample_total(text, "xlnetqa_key_windows_total", key="bob") >= 3
    assert sample_total(text, "xlnetqa_auth_failures_total", reason="wrong_key") >= 1
    for secret in (ALICE, BOB, WRONG):
        assert secret not in text
    time.sleep(0.5)  # the access line is written after the response
    log = keyed_server.log()
    lines = access_lines(log)
    answered = [x for x in lines if x["key"] == "bob" and x["route"] == "/answer" and x["status"] == 200]
    assert len(answered) >= 3 and all(x["windows"] >= 1 and x["latency_ms"] > 0 for x in answered)
    assert any(x["status"] == 401 and x["key"] == "-" for x in lines)
    for secret in (ALICE, BOB, WRONG, secret_question, OK["context"]):
        assert secret not in log


def test_json_logs_are_json_on_every_line_and_probes_stay_quiet(onnx_export, tmp_path):
    """--log-format json: every line the server writes is one JSON object (the access log's fields as
    fields, never a JSON string inside a text line); a probe that succeeds writes no access line."""
    with ServerProcess(onnx_export, tmp_path, "--log-format", "json", log_level="info") as s:
        for _ in range(5):
            assert httpx.get(s.url + "/readyz", timeout=10).status_code == 200
        assert post(s.url + "/answer", OK, headers={"X-Request-ID": "json-log-check"}).status_code == 200
        time.sleep(0.5)  # the access line is written after the response
        log = s.log()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert lines and len(lines) == len([line for line in log.splitlines() if line.strip()]), log[-2000:]
    access = [x for x in lines if x["logger"] == "server.access"]
    assert not [x for x in access if x["route"] == "/readyz" and x["status"] == 200]  # the five probes: none
    (line,) = [x for x in access if x["route"] == "/answer"]
    assert line["request_id"] == "json-log-check" and line["status"] == 200 and line["windows"] >= 1
    assert {"time", "level", "message", "key", "client", "method", "latency_ms"} <= set(line)


def test_rotation_by_sighup_and_by_file_change_never_drops_a_request(onnx_export, tmp_path):
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    # polling with withdrawn keys must not trip the failure budget: this test is about rotation
    flags = ["--api-keys-file", str(keys), "--auth-failures-per-minute", "100000"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        assert s.proc is not None

        def status(key: str) -> int:
            return post(s.url + "/answer", OK, headers=bearer(key)).status_code

        # a request in flight: let in with alice's key, its body not yet sent
        body = json.dumps(OK).encode()
        head = (
            f"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sock.sendall(head.encode() + body[:5])
        time.sleep(0.3)
        keys_file(keys, f"alice: {ALICE}", f"bob: {BOB}")  # the new key beside the old: both valid
        s.proc.send_signal(signal.SIGHUP)
        until(lambda: status(BOB) == 200, "SIGHUP did not load the new key")
        assert status(ALICE) == 200
        keys_file(keys, f"bob: {BOB}")  # alice's key withdrawn while her request is still in flight
        s.proc.send_signal(signal.SIGHUP)
        until(lambda: status(ALICE) == 401, "SIGHUP did not withdraw the old key")
        sock.sendall(body[5:])
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        sock.close()
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        keys_file(keys, f"bob: {BOB}", f"carol: {CAROL}")  # no signal: the changed file is noticed
        until(lambda: status(CAROL) == 200, "the changed keys file was not reloaded")
        keys.write_text(f"bob: {BOB}\ncarol: short\n")  # a broken line: only what is still listed stays
        s.proc.send_signal(signal.SIGHUP)
        until(lambda: "not fully reloaded" in s.log(), "the broken file was not reported")
        assert status(BOB) == 200 and status(CAROL) == 401
        assert "short" not in s.log()


def test_a_key_over_its_rate_gets_429_while_another_key_is_served(onnx_export, tmp_path):
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    flags = ["--api-keys-file", str(keys), "--key-requests-per-s", "0.2", "--key-request-burst", "2"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        codes = [post(s.url + "/answer", OK, headers=bearer(ALICE)) for _ in range(4)]
        assert [r.status_code for r in codes[:2]] == [200, 200]
        refused = [r for r in codes[2:] if r.status_code == 429]
        assert refused and all(int(r.headers["retry-after"]) >= 1 for r in refused)
        assert refused[0].json()["error"] == "rate_limited"
        # the rate is checked at the door, before the body: a flood of malformed bodies is throttled too
        malformed = post(s.url + "/answer", None, raw=b'{"question": ', headers=bearer(ALICE))
        assert malformed.status_code == 429
        assert post(s.url + "/answer", OK, headers=bearer(BOB)).status_code == 200
        text = httpx.get(s.url + "/metrics", headers=bearer(BOB), timeout=10).text
        assert sample_total(text, "xlnetqa_rate_limited_total", key="alice", limit="requests_per_s") >= 1
        assert sample_total(text, "xlnetqa_rate_limited_total", key="bob") == 0
        # the SDK: a typed error, after honouring Retry-After only while it fits in the deadline
        with XLNetQAClient(s.url, api_key=ALICE, retries=3, deadline=2.0) as qa:
            with pytest.raises(XLNetQARateLimitError) as err:
                qa.answer(OK["question"], OK["context"])
            assert err.value.status_code == 429 and err.value.retry_after is not None


def test_window_rate_and_daily_quota(onnx_export, xlnet_tok, tmp_path):
    context = long_context(xlnet_tok, "What?", 3)
    windows = len(featurize_one("What?", context, xlnet_tok, **WINDOWS))
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}", f"carol: {CAROL}")
    flags = [
        "--api-keys-file",
        str(keys),
        "--key-windows-per-s",
        "0.01",
        "--key-window-burst",
        str(windows + 1),
    ]
    flags += ["--key-daily-requests", "3"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        body = {"question": "What?", "context": context}
        assert post(s.url + "/answer", body, headers=bearer(ALICE)).status_code == 200
        second = post(s.url + "/answer", body, headers=bearer(ALICE))
        assert second.status_code == 429 and "windows/s" in second.json()["message"]
        assert post(s.url + "/answer", OK, headers=bearer(BOB)).status_code == 200
        # alice has used 2 of her 3 daily requests (a refusal counts as a request made)
        assert post(s.url + "/answer", OK, headers=bearer(ALICE)).status_code == 200
        day = post(s.url + "/answer", OK, headers=bearer(ALICE))
        assert day.status_code == 429 and "daily quota" in day.json()["message"]
        assert 1 <= int(day.headers["retry-after"]) <= 86400
        text = httpx.get(s.url + "/metrics", headers=bearer(CAROL), timeout=10).text
        assert sample_total(text, "xlnetqa_rate_limited_total", key="alice", limit="windows_per_s") == 1
        assert sample_total(text, "xlnetqa_rate_limited_total", key="alice", limit="daily_requests") == 1


def test_a_request_tokenized_then_refused_as_too_large_is_charged_to_its_key(
    onnx_export, xlnet_tok, tmp_path
):
    """413 after tokenizing (too many windows) puts the windows it asked for on the key's window rate as
    a debt: the door refuses the key, before reading its next body, until the debt is paid."""
    context = long_context(xlnet_tok, "What?", 6)
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    flags = ["--api-keys-file", str(keys), "--key-windows-per-s", "0.5", "--max-request-windows", "4"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        big = post(s.url + "/answer", {"question": "What?", "context": context}, headers=bearer(ALICE))
        assert big.status_code == 413 and big.json()["error"] == "too_many_windows"
        owed = post(s.url + "/answer", OK, headers=bearer(ALICE))
        assert owed.status_code == 429 and "owed" in owed.json()["message"], owed.json()
        assert int(owed.headers["retry-after"]) >= 2
        assert post(s.url + "/answer", OK, headers=bearer(BOB)).status_code == 200  # another key pays nothing


def test_bad_keys_file_refuses_to_start_without_printing_a_key(onnx_export, tmp_path):
    import subprocess
    import sys

    from server_helpers import server_env

    bad = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", "bob: tooshort")
    cmd = [sys.executable, "-m", "server", "--model", str(onnx_export), "--api-keys-file", str(bad)]
    r = subprocess.run(cmd, env=server_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "line 2" in r.stderr and "tooshort" not in r.stderr + r.stdout
    empty = keys_file(tmp_path / "empty.txt")
    cmd[-1] = str(empty)
    r = subprocess.run(cmd, env=server_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no API keys" in r.stderr


def test_keys_from_the_environment_and_a_warning_when_open_beyond_loopback(onnx_export, tmp_path):
    with ServerProcess(onnx_export, tmp_path, env={"XLNETQA_API_KEYS": f"alice:{ALICE},{BOB}"}) as s:
        assert post(s.url + "/answer", OK).status_code == 401
        assert post(s.url + "/answer", OK, headers=bearer(ALICE)).status_code == 200
        assert post(s.url + "/answer", OK, headers={"X-API-Key": BOB}).status_code == 200
        assert "XLNETQA_API_KEYS" not in " ".join(s.command) and ALICE not in " ".join(s.command)
    with ServerProcess(onnx_export, tmp_path, "--host", "0.0.0.0") as s:  # listens on all; we ask on loopback
        assert post(s.url + "/answer", OK).status_code == 200
        assert sum("no API keys: anyone who reaches" in line for line in s.log().splitlines()) == 1


def test_sdk_key_from_env_never_shows_and_401_is_typed(keyed_server, monkeypatch):
    monkeypatch.setenv("XLNETQA_API_KEY", ALICE)
    with XLNetQAClient(keyed_server.url) as qa:
        assert ALICE not in repr(qa)
        assert qa.answer(OK["question"], OK["context"]).model
    monkeypatch.delenv("XLNETQA_API_KEY")
    with XLNetQAClient(keyed_server.url, api_key=WRONG, retries=3) as qa:
        with pytest.raises(XLNetQAAuthenticationError) as err:
            qa.answer(OK["question"], OK["context"])
        assert err.value.status_code == 401 and WRONG not in str(err.value) and WRONG not in repr(err.value)
    with pytest.raises(ValueError, match="credentials"):
        XLNetQAClient(keyed_server.url.replace("http://", "http://user:secret@"))


def test_https_with_a_key_and_the_sdk_verifying_the_ca(onnx_export, tmp_path):
    ca, cert, key = make_certificates(tmp_path)
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    flags = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--api-keys-file", str(keys)]
    with ServerProcess(onnx_export, tmp_path, *flags, tls_ca=ca) as s:
        assert s.url.startswith("https://")
        with XLNetQAClient(s.url, api_key=ALICE, verify=str(ca)) as qa:
            assert qa.answer(OK["question"], OK["context"]).model
        qa = XLNetQAClient(s.url, api_key=ALICE, retries=0)  # the system's CAs do not know ours
        with qa, pytest.raises(XLNetQAConnectionError):
            qa.answer(OK["question"], OK["context"])
        plain = s.url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(plain + "/healthz", timeout=5)


def test_tls_settings_are_checked_before_listening(onnx_export, tmp_path):
    import subprocess
    import sys

    from server_helpers import server_env

    _, cert, _ = make_certificates(tmp_path)
    base = [sys.executable, "-m", "server", "--model", str(onnx_export)]
    r = subprocess.run([*base, "--ssl-certfile", str(cert)], env=server_env(), capture_output=True, text=True)
    assert r.returncode == 2 and "give both or neither" in r.stderr
    wrong = [*base, "--ssl-certfile", str(cert), "--ssl-keyfile", str(cert)]
    r = subprocess.run(wrong, env=server_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "TLS: cannot use" in r.stderr


def test_host_header_checks_against_dns_rebinding(onnx_export, tmp_path):
    with ServerProcess(onnx_export, tmp_path) as s:  # bound to loopback: loopback names only
        for host in ("127.0.0.1", f"127.0.0.1:{s.port}", f"localhost:{s.port}", f"[::1]:{s.port}"):
            assert httpx.get(s.url + "/healthz", headers={"Host": host}, timeout=10).status_code == 200, host
        rebound = post(s.url + "/answer", OK, headers={"Host": f"attacker.example:{s.port}"})
        assert rebound.status_code == 400 and rebound.json()["error"] == "invalid_host"
    with ServerProcess(onnx_export, tmp_path, "--trusted-hosts", "qa.example.com, qa.internal") as s:
        assert post(s.url + "/answer", OK, headers={"Host": "qa.example.com"}).status_code == 200
        assert post(s.url + "/answer", OK, headers={"Host": "QA.internal:443"}).status_code == 200
        assert post(s.url + "/answer", OK).status_code == 400  # 127.0.0.1 is not in the list
    with ServerProcess(onnx_export, tmp_path, "--trusted-hosts", "*") as s:
        assert post(s.url + "/answer", OK, headers={"Host": "anything.example"}).status_code == 200
