"""``--metrics-port``: served by a process of its own (server/observability/metrics_port.py) that nothing a client does
there can turn against the API. Against a real server on 127.0.0.1: a scrape gets the server's
metrics, rendered at most once a second; half-sent requests and HTTP/0.9 get nothing and are closed by
the deadline; only /metrics is served; hundreds of held connections leave the API answering; the
process dies with the server, even by kill -9; a port in use stops the start in one line. (The flood
beside a key holder: tests/test_server_floods.py.)"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from auth_helpers import until
from module_runs import run_module
from server_helpers import OK, ServerProcess, server_env

from bench.flood_scenarios import metrics_port_of
from server.observability.metrics import sample_total
from server.observability.metrics_port import CACHE_S, HEAD_TIMEOUT_S, MAX_CONNECTIONS


@pytest.fixture(scope="module")
def served(
    onnx_export: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, int]]:
    """A one-process server with its metrics on a port the system picked (read from its log)."""
    log_dir = tmp_path_factory.mktemp("metrics_port")
    with ServerProcess(onnx_export, log_dir, "--metrics-port", "0", log_level="info") as s:
        yield s, metrics_port_of(s.log())


def exchange(port: int, data: bytes, wait_s: float = 10.0) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


def test_a_scrape_gets_the_servers_metrics_rendered_at_most_once_a_second(served) -> None:
    s, port = served
    assert httpx.post(s.url + "/answer", json=OK, timeout=30).status_code == 200
    time.sleep(CACHE_S)  # past any rendering cached before that answer
    first = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/plain")
    assert sample_total(first.text, "xlnetqa_questions_total") >= 1
    assert httpx.post(s.url + "/answer", json=OK, timeout=30).status_code == 200
    again = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert again.text == first.text  # within the second: the same rendering
    time.sleep(CACHE_S)
    later = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert sample_total(later.text, "xlnetqa_questions_total") > sample_total(
        first.text, "xlnetqa_questions_total"
    )
    head = httpx.head(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404


def test_half_sent_and_http_0_9_requests_get_nothing_and_are_closed_by_the_deadline(served) -> None:
    _, port = served
    start = time.monotonic()
    assert exchange(port, b"GET /metr") == b""  # half a request: closed at the head deadline
    assert HEAD_TIMEOUT_S - 0.5 <= time.monotonic() - start <= HEAD_TIMEOUT_S + 3
    assert exchange(port, b"GET /metrics\r\n\r\n") == b""  # HTTP/0.9 (no version): no answer at all
    assert exchange(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == b""


def test_hundreds_of_held_connections_leave_the_api_answering(served) -> None:
    """Four times the process's connection cap, held half-sent: the API answers as before and the port
    serves scrapes again once they are gone."""
    s, port = served
    held = []
    for _ in range(4 * MAX_CONNECTIONS):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))  # the backlog takes what the process does not accept
        held.append(sock)
    try:
        time.sleep(0.5)
        for _ in range(10):
            assert httpx.post(s.url + "/answer", json=OK, timeout=10).status_code == 200
    finally:
        for sock in held:
            sock.close()
    until(lambda: _scrapes(port), "the metrics port never served again", 15)


def _scrapes(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def metrics_processes(parent: int) -> set[int]:
    """The metrics processes ``parent`` started."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if (
                b"server.observability.metrics_port" in cmdline.read_bytes()
                and _parent(int(cmdline.parent.name)) == parent
            ):
                found.add(int(cmdline.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_the_metrics_process_dies_with_the_server_even_by_kill_9(onnx_export: Path, tmp_path: Path) -> None:
    with ServerProcess(onnx_export, tmp_path, "--metrics-port", "0", log_level="info") as s:
        assert s.proc is not None
        port = metrics_port_of(s.log())
        children = metrics_processes(s.proc.pid)
        assert len(children) == 1, children
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(10)
        (child,) = children
        until(
            lambda: not Path(f"/proc/{child}").exists() or _zombie(child),
            "the metrics process outlived the server",
            10,
        )
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_metrics_port_in_use_stops_the_start_in_one_line(onnx_export: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = run_module(
            "server", "--model", onnx_export, "--metrics-port", str(port), env=server_env(), timeout=60
        )
    assert r.returncode == 2 and f"--metrics-port {port}: cannot listen" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
