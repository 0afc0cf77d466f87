"""No test loses its port to a neighbour. A port probed free and bound later could be taken between the
two by any program asking the system for a port; this suite never does that: a server gets a socket
bound for it and handed over (``--listen-fd``), a refused port is a socket held bound and not listening,
and the ports that code must bind itself (torchrun, the docs' commands, another checkout's server)
come from below the system's ephemeral range, which no program binding port 0 is ever given. Tested
beside a neighbour that keeps grabbing every ephemeral port it can, as a busy CI machine's other jobs
do, and on the server's side: a descriptor that is not a listening TCP socket is one line, exit 2."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from module_runs import run_module
from server_helpers import OK, ServerProcess, server_env

from harness.server_process import _ephemeral_low, free_port, refusing_port

NEIGHBOUR = """
import socket, sys, time
held = []
end = time.monotonic() + float(sys.argv[1])
print("grabbing", flush=True)
while time.monotonic() < end:
    try:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); held.append(s)
    except OSError:
        time.sleep(0.001)
    if len(held) > 3000:
        held.pop(0).close()
"""


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen]:
    """A process binding port after port from the ephemeral range for the test's duration."""
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, "120"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "grabbing"
    time.sleep(0.5)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_servers_and_ports_beside_a_neighbour_grabbing_ports(
    onnx_export: Path, tmp_path: Path, neighbour
) -> None:
    for _ in range(3):  # a socket handed over: nothing to lose
        with ServerProcess(onnx_export, tmp_path) as s:
            assert s.proc is not None and b"--listen-fd" in Path(f"/proc/{s.proc.pid}/cmdline").read_bytes()
            assert httpx.post(s.url + "/answer", json=OK, timeout=30).status_code == 200
    low = _ephemeral_low()
    for _ in range(100):  # probed, then bound a moment later (torchrun, a command in the docs)
        port = free_port()
        assert port < low
        time.sleep(0.005)
        with socket.socket() as late:
            late.bind(("127.0.0.1", port))
    with refusing_port() as held:  # refused while held, then handed to a server that serves it
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/healthz", timeout=5)
        with ServerProcess(onnx_export, tmp_path, listen_socket=held) as s:
            assert s.url == url and httpx.get(url + "/healthz", timeout=10).status_code == 200
    assert neighbour.poll() is None  # it grabbed all along


def test_the_server_refuses_a_descriptor_that_is_not_a_listening_socket(onnx_export: Path) -> None:
    r = run_module("server", "--model", onnx_export, "--listen-fd", "0", env=server_env(), timeout=60)
    assert r.returncode == 2 and "--listen-fd 0: not a socket" in r.stderr, r.stderr
    with socket.socket() as bound:  # bound, never listening
        bound.bind(("127.0.0.1", 0))
        fd = bound.fileno()
        cmd = [sys.executable, "-m", "server", "--model", str(onnx_export), "--listen-fd", str(fd)]
        done = subprocess.run(
            cmd, env=server_env(), capture_output=True, text=True, timeout=60, pass_fds=(fd,)
        )
    assert done.returncode == 2 and "is not listening" in done.stderr and "Traceback" not in done.stderr


def test_a_handed_over_socket_serves_fronts_over_an_engine_and_refuses_once_they_exit(
    onnx_export: Path, tmp_path: Path
) -> None:
    with ServerProcess(onnx_export, tmp_path, "--workers", "2") as s:
        assert httpx.post(s.url + "/answer", json=OK, timeout=30).status_code == 200
    with pytest.raises(httpx.ConnectError):  # nobody kept a copy listening: refused, not left hanging
        httpx.get(s.url + "/healthz", timeout=5)
