"""The door attacked by someone who has read the code: each test is one attack, run against a real
``python -m server`` on 127.0.0.1 (raw sockets where an HTTP client would tidy the attack away).

Lockout of every key by one keyless neighbour, label explosion in /metrics, spoofed X-Forwarded-For,
comment text turned into a key, revocation that fails open, weak keys and key names derived from the
key, TLS connections that never handshake, an encrypted TLS key that would prompt on a terminal,
request smuggling through Content-Length + Transfer-Encoding, ``Expect: 100-continue`` without a key,
WebSocket scopes that would bypass the door. Elsewhere: model files swapped in past their hashes
(``test_model_file_hashes.py``), an SDK that would leak its key (``test_sdk_keys.py``), the playground's
key field in Chromium (``test_playground.py``), a respawned worker that must not accept before it is
ready (``test_server_workers.py``).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import select
import signal
import socket
import ssl
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import pytest
from auth_helpers import ALICE, BOB, WRONG, bearer, keys_file, until
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import OK, ServerProcess, post, server_env
from server_helpers import access_lines as parse_access_lines

from bench.flood_scenarios import metrics_port_of
from harness.certificates import make_certificates
from server.app import create_app
from server.settings import ServerSettings


def exchange(port: int, data: bytes, seconds: float = 10.0, tls: ssl.SSLContext | None = None) -> bytes:
    """Send raw bytes on one connection and read until the server closes it (or ``seconds`` pass)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=seconds)
    if tls is not None:
        sock = tls.wrap_socket(sock, server_hostname="127.0.0.1")
    reply = b""
    deadline = time.monotonic() + seconds
    try:
        sock.sendall(data)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            reply += chunk
    finally:
        sock.close()
    return reply


def access_lines(server: ServerProcess) -> list[dict]:
    return parse_access_lines(server.log())


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every time series of a Prometheus exposition: (sample name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# ---- authentication: the key decides first, the budget counts the real client ------------------------


def test_a_keyless_neighbour_on_the_same_address_cannot_lock_out_a_valid_key(onnx_export, tmp_path):
    """Behind an ingress every caller has the ingress's address: its failures must not refuse a key."""
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    with ServerProcess(
        onnx_export, tmp_path, "--api-keys-file", str(keys), "--auth-failures-per-minute", "6"
    ) as s:
        refused = [post(s.url + "/answer", OK, headers=bearer(WRONG)) for _ in range(4)]
        assert refused[0].status_code == 401 and 429 in [
            r.status_code for r in refused
        ]  # over its budget ...
        assert int(refused[-1].headers["retry-after"]) >= 1
        assert httpx.get(s.url + "/healthz", timeout=10).status_code == 200  # probes stay open
        served = []
        for _ in range(10):  # ... and keeps trying between the tenant's requests
            assert post(s.url + "/answer", OK, headers=bearer(WRONG)).status_code == 429
            served.append(post(s.url + "/answer", OK, headers=bearer(ALICE)).status_code)
        assert served == [200] * 10
        text = httpx.get(s.url + "/metrics", headers=bearer(ALICE), timeout=10).text
        assert 'reason="address_blocked"' in text


def test_junk_methods_and_paths_add_no_metric_series(onnx_export, tmp_path):
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    flags = ["--api-keys-file", str(keys), "--auth-failures-per-minute", "100000", "--auth-metrics", "false"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:

        def junk(n: int) -> None:
            for i in range(n):
                method = "X" + secrets.token_hex(100).upper()  # a 201-byte method, new every time
                path = f"/{secrets.token_hex(8)}/{i}"
                for headers in ({}, bearer(ALICE)):
                    for target in ("/answer", path):
                        r = httpx.request(method, s.url + target, headers=headers, timeout=10)
                        # an unregistered method is not HTTP to the parser: 400 before the app
                        assert r.status_code == 400 and r.json()["error"] == "bad_request", r.status_code
                        r = httpx.request("PATCH", s.url + target, headers=headers, timeout=10)
                        assert r.status_code in (401, 404, 405), r.status_code

        junk(1)  # the series a junk request may add once (method "other", route "unmatched", ...)
        httpx.get(s.url + "/metrics", timeout=10)  # and the scrape's own
        before = httpx.get(s.url + "/metrics", timeout=10).text
        junk(40)
        after = httpx.get(s.url + "/metrics", timeout=10).text
        assert series(after) == series(before)
        assert len(after) < len(before) + 2000  # values grew, labels did not
        labels = {v for _, ls in series(after) for _, v in ls}
        assert all(len(v) <= 64 for v in labels), max(labels, key=len)[:80]


def test_forwarded_for_is_believed_only_from_the_named_proxies(onnx_export, tmp_path):
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    flags = ["--api-keys-file", str(keys), "--auth-failures-per-minute", "6", "--log-level", "info"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:  # default: no proxy is believed
        codes = [
            post(
                s.url + "/answer", OK, headers={**bearer(WRONG), "X-Forwarded-For": f"203.0.113.{i}"}
            ).status_code
            for i in range(1, 9)
        ]
        assert 429 in codes, codes  # a new forwarded address per try does not reset the budget
        time.sleep(0.3)
        assert {line["client"] for line in access_lines(s)} == {"127.0.0.1"}
    proxy = [*flags, "--forwarded-allow-ips", "127.0.0.1"]
    with ServerProcess(onnx_export, tmp_path, *proxy) as s:  # behind a proxy on loopback
        for i in range(1, 9):  # each real client has its own budget
            r = post(s.url + "/answer", OK, headers={**bearer(WRONG), "X-Forwarded-For": f"203.0.113.{i}"})
            assert r.status_code == 401
        one = {"X-Forwarded-For": "198.51.100.7"}
        codes = [post(s.url + "/answer", OK, headers={**bearer(WRONG), **one}).status_code for _ in range(4)]
        assert 429 in codes
        assert post(s.url + "/answer", OK, headers={**bearer(ALICE), **one}).status_code == 200
        time.sleep(0.3)
        assert {"198.51.100.7", "203.0.113.1"} <= {line["client"] for line in access_lines(s)}


# ---- the keys file: comments, revocation, weak keys, names -------------------------------------------


def test_comment_text_never_becomes_a_key(onnx_export, tmp_path):
    hidden = "rotate-every-90-days-please-team"
    keys = keys_file(
        tmp_path / "keys.txt", f"# production keys, {hidden}", f"alice: {ALICE}  # alice's, {hidden}2"
    )
    with ServerProcess(onnx_export, tmp_path, "--api-keys-file", str(keys)) as s:
        assert post(s.url + "/answer", OK, headers=bearer(hidden)).status_code == 401
        assert post(s.url + "/answer", OK, headers=bearer(hidden + "2")).status_code == 401
        assert post(s.url + "/answer", OK, headers=bearer(ALICE)).status_code == 200
    # the environment variable is a list: commas separate keys there, and only there
    with ServerProcess(onnx_export, tmp_path, env={"XLNETQA_API_KEYS": f"alice:{ALICE}, bob:{BOB}"}) as s:
        assert post(s.url + "/answer", OK, headers=bearer(BOB)).status_code == 200


def test_revocation_never_fails_open(onnx_export, tmp_path):
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    # polling with withdrawn keys must not trip the failure budget: this test is about revocation
    flags = ["--api-keys-file", str(keys), "--auth-failures-per-minute", "100000", "--log-level", "info"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        assert s.proc is not None

        def status(key: str) -> int:
            return post(s.url + "/answer", OK, headers=bearer(key)).status_code

        assert status(ALICE) == 200 and status(BOB) == 200
        # bob is revoked by an edit that also breaks another line: bob goes, alice stays, nothing is added
        newcomer = "carol-key-00112233445566778899"
        keys_file(keys, f"alice: {ALICE}", "dave: too-short", f"carol: {newcomer}")
        s.proc.send_signal(signal.SIGHUP)
        until(lambda: status(BOB) == 401, "a failed reload kept a removed key")
        assert status(ALICE) == 200 and status(newcomer) == 401
        keys.unlink()  # the file is gone: nobody is let in, and the log says so once
        until(lambda: status(ALICE) == 401, "a deleted keys file kept its keys")
        keys_file(keys, f"alice: {ALICE}")
        until(lambda: status(ALICE) == 200, "the restored keys file was not read")
        keys.write_text("# nothing here\n")  # emptied: nobody
        until(lambda: status(ALICE) == 401, "an emptied keys file kept its keys")
        log = s.log()
        assert "deny every request" in log
        for secret in (ALICE, BOB, newcomer, "too-short"):
            assert secret not in log


def test_weak_keys_refuse_to_start_and_bare_key_names_say_nothing_of_the_key(onnx_export, tmp_path):
    for weak in ("a" * 40, "0123456789abcdef", "abababababababababababababababab"):
        keys = keys_file(tmp_path / "weak.txt", f"alice: {weak}")
        cmd = [sys.executable, "-m", "server", "--model", str(onnx_export), "--api-keys-file", str(keys)]
        r = subprocess.run(cmd, env=server_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "line 1" in r.stderr and "128 bits" in r.stderr, r.stderr
        assert weak not in r.stderr + r.stdout
    bare, other = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    keys = keys_file(tmp_path / "keys.txt", "# two bare keys", bare, other)
    flags = ["--api-keys-file", str(keys), "--log-level", "info", "--key-daily-requests", "2"]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        assert post(s.url + "/answer", OK, headers=bearer(bare)).status_code == 200
        text = httpx.get(s.url + "/metrics", headers=bearer(bare), timeout=10).text  # its 2nd of 2
        names = {
            v
            for name, ls in series(text)
            if name == "xlnetqa_key_requests_total"
            for k, v in ls
            if k == "key"
        }
        import hashlib

        name = "key-" + hashlib.sha256(bare.encode()).hexdigest()[:12]
        assert names - {"anonymous"} == {name}  # a bare key is named by its digest, not its line
        assert bare not in text and bare not in s.log()
        # A comment inserted above moves every key down a line: each keeps its name and its count,
        # so the used-up quota stays used up and the other key is charged nothing.
        keys_file(tmp_path / "keys.txt", "# two bare keys", "# a comment inserted above", bare, other)
        time.sleep(1.2)  # reread within a second of the change
        assert post(s.url + "/answer", OK, headers=bearer(bare)).status_code == 429
        assert [post(s.url + "/answer", OK, headers=bearer(other)).status_code for _ in range(2)] == [
            200,
            200,
        ]


def test_a_keys_file_others_can_read_or_write_is_refused_unless_allowed(onnx_export, tmp_path):
    import hashlib

    key = secrets.token_urlsafe(32)
    for mode in (0o644, 0o666, 0o604, 0o620):
        keys = keys_file(tmp_path / "keys.txt", f"alice: {key}", mode=mode)
        cmd = [sys.executable, "-m", "server", "--model", str(onnx_export), "--api-keys-file", str(keys)]
        r = subprocess.run(cmd, env=server_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "by other users" in r.stderr and "chmod 600" in r.stderr, (
            mode,
            r.stderr,
        )
        assert key not in r.stderr + r.stdout
    keys = keys_file(tmp_path / "keys.txt", f"alice: {key}", mode=0o644)
    with ServerProcess(onnx_export, tmp_path, "--api-keys-file", str(keys), "--allow-shared-keys-file") as s:
        assert post(s.url + "/answer", OK, headers=bearer(key)).status_code == 200
        assert "readable by other users" in s.log() and "--allow-shared-keys-file" in s.log()
    # Opened to others while serving (a chmod is a change): the keys are withdrawn, never trusted.
    keys.chmod(0o600)
    with ServerProcess(onnx_export, tmp_path, "--api-keys-file", str(keys)) as s:
        assert post(s.url + "/answer", OK, headers=bearer(key)).status_code == 200
        keys.chmod(0o666)
        time.sleep(1.2)
        assert post(s.url + "/answer", OK, headers=bearer(key)).status_code == 401
        assert "writable by other users" in s.log()
    assert hashlib.sha256(key.encode()).hexdigest() not in s.log()


# ---- TLS: a handshake has the header deadline and counts as a connection ------------------------------


@pytest.mark.serial  # a timing bound
def test_a_tls_connection_that_never_handshakes_is_closed_and_counted(onnx_export, tmp_path):
    ca, cert, key = make_certificates(tmp_path)
    flags = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--header-timeout-s", "1.5"]
    with ServerProcess(onnx_export, tmp_path, *flags, "--max-connections", "3", tls_ca=ca) as s:
        silent = [socket.create_connection(("127.0.0.1", s.port), timeout=30) for _ in range(2)]
        time.sleep(0.3)
        # two connections in their handshake hold two of the three places; a client's new connection
        # is still served: the oldest idle one that no request has used gives way (server.door.pool)
        start = time.monotonic()
        assert httpx.get(s.url + "/v1/model", verify=str(ca), timeout=10).status_code == 200
        assert silent[0].recv(1) == b"" and time.monotonic() - start < 1.0  # evicted at once
        assert silent[1].recv(1) == b""  # the other: closed by the server at the header deadline
        assert time.monotonic() - start < 5
        for sock in silent:
            sock.close()
        assert httpx.get(s.url + "/v1/model", verify=str(ca), timeout=10).status_code == 200
        # a handshake completed but no request: the same deadline, counted from the connection's start
        context = ssl.create_default_context(cafile=str(ca))
        start = time.monotonic()
        assert exchange(s.port, b"", seconds=10, tls=context) == b""
        assert time.monotonic() - start < 5


def _run_on_a_terminal(cmd: list[str], seconds: float) -> tuple[int | None, str]:
    """Run ``cmd`` with a pseudo-terminal as its controlling terminal (where OpenSSL would prompt)."""
    master, slave = os.openpty()

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        cmd, stdin=slave, stdout=slave, stderr=slave, env=server_env(), start_new_session=True,
        preexec_fn=take_terminal,  # noqa: PLW1509 - the child needs the terminal before it runs
    )  # fmt: skip
    os.close(slave)
    out = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    chunk = b""
                out += chunk
                if not chunk and proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        os.close(master)
    return proc.returncode if proc.returncode >= 0 else None, out.decode(errors="replace")


def test_an_encrypted_tls_key_is_one_error_line_never_a_prompt(onnx_export, tmp_path):
    _, cert, key = make_certificates(tmp_path, passphrase=b"operator-passphrase")
    cmd = [sys.executable, "-m", "server", "--model", str(onnx_export)]
    code, out = _run_on_a_terminal([*cmd, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)], 30)
    assert "enter pem pass phrase" not in out.lower(), out
    assert code == 2, out
    assert "encrypted" in out and out.strip().count("\n") == 0, out


# ---- HTTP framing and non-HTTP scopes -----------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("door-logs")
    keys = keys_file(logs / "keys.txt", f"alice: {ALICE}")
    with ServerProcess(
        onnx_export, logs, "--api-keys-file", str(keys), "--auth-failures-per-minute", "100000"
    ) as s:
        yield s


SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def test_content_length_with_transfer_encoding_is_refused_and_closed(keyed):
    body = json.dumps(OK).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    for auth in (b"", f"Authorization: Bearer {ALICE}\r\n".encode()):
        head = (
            b"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + auth
            + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(chunked)
        )  # fmt: skip
        reply = exchange(keyed.port, head + chunked + SMUGGLED)
        assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
        assert reply.count(b"HTTP/1.1 ") == 1, reply  # the smuggled request never ran
        assert b'"error":"bad_framing"' in reply.replace(b" ", b"")


@pytest.mark.serial  # a timing bound
def test_expect_100_continue_without_a_key_gets_401_not_continue(keyed):
    head = (
        b"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
    )
    start = time.monotonic()
    reply = exchange(keyed.port, head, seconds=10)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"100 Continue" not in reply
    assert time.monotonic() - start < 1.5  # answered at once, not after draining a body never sent
    # with a key, the client is invited to send its body and is answered
    body = json.dumps(OK).encode()
    head = (
        b"POST /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + f"Authorization: Bearer {ALICE}\r\n".encode()
        + b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(body)
    )
    sock = socket.create_connection(("127.0.0.1", keyed.port), timeout=10)
    sock.sendall(head)
    assert sock.recv(1024).startswith(b"HTTP/1.1 100")
    sock.sendall(body)
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    sock.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_websocket_upgrades_are_plain_requests_and_refused(keyed, onnx_export):
    upgrade = (
        b"GET /answer HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    reply = exchange(keyed.port, upgrade)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]  # no upgrade: the door answers as for any GET
    # in the app itself, a WebSocket route added later is never reached: non-HTTP scopes are refused
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocket, WebSocketDisconnect

    app = create_app(ServerSettings(model=onnx_export, playground=False))

    @app.websocket("/ws")
    async def echo(ws: WebSocket) -> None:  # what a later change might add
        await ws.accept()
        await ws.send_text("open")

    with (
        TestClient(app) as client,
        pytest.raises(WebSocketDisconnect),
        client.websocket_connect("/ws", headers={"Host": "127.0.0.1"}) as ws,
    ):
        ws.receive_text()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_metrics_port_serves_a_scraper_without_a_key_and_the_api_port_keeps_its_door(
    onnx_export, tmp_path, workers
):
    from server.observability.metrics import sample_total

    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    flags = ["--api-keys-file", str(keys), "--metrics-port", "0", "--workers", workers]  # any free port
    with ServerProcess(onnx_export, tmp_path, *flags, log_level="info") as s:
        port = metrics_port_of(s.log())
        assert post(s.url + "/answer", OK, headers=bearer(ALICE)).status_code == 200
        assert httpx.get(s.url + "/metrics", timeout=10).status_code == 401  # the API's port: a key
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert scraped.status_code == 200
        assert sample_total(scraped.text, "xlnetqa_key_requests_total", key="alice", status="200") >= 1
        if workers == "2":  # every process's values: the engine's backend calls too
            assert sample_total(scraped.text, "xlnetqa_batch_size_count") >= 1


def test_a_pipelined_flood_is_cut_at_the_cap_before_it_queues_up(keyed):
    """A keyless client pipelining 200 tiny requests in one write: the parser stops queueing at 16
    waiting behind the first (400 too_many_pipelined, then the connection closes); the server answers
    at most that many and stays fine."""
    from server.door.connection import MAX_PIPELINED

    one = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    reply = exchange(keyed.port, one * 200, seconds=10)
    answers = reply.count(b"HTTP/1.1 ")
    assert 1 <= answers <= MAX_PIPELINED + 2, answers
    assert b"too_many_pipelined" in reply
    assert httpx.get(keyed.url + "/healthz", timeout=10).status_code == 200
