"""``python -m server --workers N`` against real uvicorn on 127.0.0.1: a worker that dies is respawned by
uvicorn's supervisor, and the new worker takes no connection before its model can answer, so clients
served by its siblings never see it loading.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
from server_helpers import OK, ServerProcess

from server.metrics import sample_total

WARMUP_DELAY_S = 4.0  # each worker's load takes at least this long: long enough to be seen


def worker_pids(supervisor: int) -> set[int]:
    """The supervisor's worker processes (multiprocessing spawn children), found through /proc."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[1]) == supervisor and fields[0] != "Z" and b"spawn_main" in cmdline:
            pids.add(int(stat.parent.name))
    return pids


def until(condition: Callable[[], object], what: str, seconds: float, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}:\n{log()[-4000:]}"
        time.sleep(0.05)


def ready_lines(s: ServerProcess) -> int:
    """How many times a worker said its model is loaded and warmed up (the first start, then respawns)."""
    return s.log().count(" ready: backend ")


class ClosedLoop:
    """``n`` clients, each sending the next request when the last one is answered, on a new connection
    each time (so the kernel hands every request to whichever worker accepts it)."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.outcomes = url, Counter[str]()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client) for _ in range(n)]

    def _client(self) -> None:
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.url, limits=no_reuse, timeout=15.0) as c:
            while not self._stop.is_set():
                try:
                    outcome = str(c.post("/answer", json=OK).status_code)
                except httpx.TransportError as exc:
                    outcome = type(exc).__name__
                with self._lock:
                    self.outcomes[outcome] += 1

    def __enter__(self) -> ClosedLoop:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def test_a_killed_worker_is_respawned_and_takes_no_request_before_its_model_is_ready(
    onnx_export: Path, tmp_path: Path
) -> None:
    flags = ["--workers", "2", "--warmup-delay-s", str(WARMUP_DELAY_S), "--access-log", "false"]
    s = ServerProcess(onnx_export, tmp_path, *flags, log_level="info", ready_timeout_s=60.0)
    try:
        s.start()
        assert s.proc is not None
        until(lambda: ready_lines(s) == 2, "both workers never became ready", 60.0, s.log)
        supervisor = s.proc.pid
        first = worker_pids(supervisor)
        assert len(first) == 2, first
        victim = min(first)
        (survivor,) = first - {victim}
        os.kill(victim, signal.SIGKILL)
        until(lambda: victim not in worker_pids(supervisor), "the killed worker stayed", 10.0, s.log)
        with ClosedLoop(s.url, 8) as clients:
            until(lambda: len(worker_pids(supervisor)) == 2, "no worker was respawned", 15.0, s.log)
            until(lambda: ready_lines(s) == 3, "the respawned worker never got ready", 45.0, s.log)
            time.sleep(1.0)  # the respawned worker now shares the load
        (respawned,) = worker_pids(supervisor) - {survivor}
        assert set(clients.outcomes) == {"200"}, clients.outcomes  # no 503 not_ready, no connection error
        # In service: with its sibling stopped, the respawned worker answers every request.
        os.kill(survivor, signal.SIGSTOP)
        try:
            statuses = [httpx.post(s.url + "/answer", json=OK, timeout=3.0).status_code for _ in range(5)]
        finally:
            os.kill(survivor, signal.SIGCONT)
        assert statuses == [200] * 5 and respawned != victim
        # the killed worker's live gauges are forgotten: two workers are ready, not three
        assert sample_total(httpx.get(s.url + "/metrics", timeout=10).text, "xlnetqa_ready") == 2
    finally:
        s.stop()


def test_workers_still_loading_stop_at_once_on_sigterm(onnx_export: Path, tmp_path: Path) -> None:
    """SIGTERM while every worker waits for its model (no connection taken yet) ends the server within
    seconds, not after the load."""
    flags = ["--workers", "2", "--warmup-delay-s", "120", "--access-log", "false"]
    s = ServerProcess(onnx_export, tmp_path, *flags, log_level="info").launch()
    try:
        assert s.proc is not None
        loading = "onnxruntime "  # the backend's line: the model is loaded, the warm-up sleep begins
        until(lambda: s.log().count(loading) == 2, "the workers never began loading", 60.0, s.log)
        began = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 0, s.log()
        assert time.monotonic() - began < 10.0
    finally:
        s.stop()


def test_a_worker_load_over_the_load_timeout_stops_the_server(onnx_export: Path, tmp_path: Path) -> None:
    flags = ["--workers", "2", "--warmup-delay-s", "120", "--load-timeout-s", "1"]
    s = ServerProcess(onnx_export, tmp_path, *flags).launch()
    try:
        assert s.proc is not None
        assert s.proc.wait(60) == 1, s.log()
    finally:
        s.stop()
    assert "took longer than 1 s" in s.log() and "model failed to load in a worker" in s.log()
