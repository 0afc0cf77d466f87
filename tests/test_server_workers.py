"""``python -m server --workers N``: N front processes over one engine process, against real uvicorn on
127.0.0.1. A front that dies is respawned by uvicorn's supervisor and takes no connection before it is
ready; an engine that dies is started again by ours while the fronts answer 503 with Retry-After and
``/readyz`` says so; the per-key limits are one set for the host whatever front a request reaches; no
request is ever left without an answer or a closed connection.
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
import pytest
from auth_helpers import ALICE, bearer, keys_file
from server_helpers import OK, ServerProcess

from bench.common import BackgroundThreads
from server.observability.metrics import sample_total

WARMUP_DELAY_S = 4.0  # the engine's load takes at least this long: long enough to be seen


def children(supervisor: int, marker: bytes) -> set[int]:
    """The supervisor's child processes whose command line holds ``marker``: ``spawn_main`` for the
    fronts (uvicorn's multiprocessing children), ``server.topology.engine`` for the engine."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[1]) == supervisor and fields[0] != "Z" and marker in cmdline:
            pids.add(int(stat.parent.name))
    return pids


def fronts(supervisor: int) -> set[int]:
    return children(supervisor, b"spawn_main")


def engines(supervisor: int) -> set[int]:
    return children(supervisor, b"server.topology.engine")


def until(condition: Callable[[], object], what: str, seconds: float, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}:\n{log()[-4000:]}"
        time.sleep(0.05)


def ready_fronts(s: ServerProcess) -> int:
    """How many times a front said it is ready (the first starts, then respawns)."""
    return s.log().count("front of model")


class ClosedLoop(BackgroundThreads):
    """``n`` clients, each sending the next request when the last one is answered, on a new connection
    each time (so the kernel hands every request to whichever front accepts it). An outcome is the
    status (with the error kind and Retry-After for a 503) or the transport error."""

    def __init__(self, url: str, n: int, headers: dict[str, str] | None = None) -> None:
        super().__init__([self._client] * n, join_s=30)
        self.url, self.headers, self.outcomes = url, headers, Counter[str]()
        self._lock = threading.Lock()

    def _client(self) -> None:
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=self.url, limits=no_reuse, timeout=15.0, headers=self.headers) as c:
            while not self.stopping.is_set():
                try:
                    r = c.post("/answer", json=OK)
                    outcome = str(r.status_code)
                    if r.status_code == 503:
                        outcome += f" {r.json()['error']} retry-after={r.headers.get('retry-after')}"
                except httpx.TransportError as exc:
                    outcome = type(exc).__name__
                with self._lock:
                    self.outcomes[outcome] += 1


def test_a_killed_front_is_respawned_and_takes_no_request_before_it_is_ready(
    onnx_export: Path, tmp_path: Path
) -> None:
    flags = ["--workers", "2", "--access-log", "false"]
    s = ServerProcess(onnx_export, tmp_path, *flags, log_level="info", ready_timeout_s=60.0)
    try:
        s.start()
        assert s.proc is not None
        until(lambda: ready_fronts(s) == 2, "both fronts never became ready", 60.0, s.log)
        supervisor = s.proc.pid
        first = fronts(supervisor)
        assert len(first) == 2 and len(engines(supervisor)) == 1, (first, engines(supervisor))
        victim = min(first)
        (survivor,) = first - {victim}
        os.kill(victim, signal.SIGKILL)
        until(lambda: victim not in fronts(supervisor), "the killed front stayed", 10.0, s.log)
        with ClosedLoop(s.url, 8) as clients:
            until(lambda: len(fronts(supervisor)) == 2, "no front was respawned", 15.0, s.log)
            until(lambda: ready_fronts(s) == 3, "the respawned front never got ready", 45.0, s.log)
            time.sleep(1.0)  # the respawned front now shares the load
        (respawned,) = fronts(supervisor) - {survivor}
        assert set(clients.outcomes) == {"200"}, clients.outcomes  # no 503 not_ready, no connection error
        # In service: with its sibling stopped, the respawned front answers every request.
        os.kill(survivor, signal.SIGSTOP)
        try:
            statuses = [httpx.post(s.url + "/answer", json=OK, timeout=3.0).status_code for _ in range(5)]
        finally:
            os.kill(survivor, signal.SIGCONT)
        assert statuses == [200] * 5 and respawned != victim
        # the killed front's live gauges are forgotten: two fronts are ready, not three (nor the engine)
        assert sample_total(httpx.get(s.url + "/metrics", timeout=10).text, "xlnetqa_ready") == 2
    finally:
        s.stop()


@pytest.mark.parametrize("limits", ["off", "on"])
def test_the_engine_killed_under_load_is_restarted_and_no_request_is_lost(
    onnx_export: Path, tmp_path: Path, limits: str
) -> None:
    """kill -9 of the engine: every request in flight or arriving gets its answer or 503
    engine_unavailable + Retry-After at once (no hang, no 500, no dropped connection); /readyz is 503
    until a new engine is ready, then 200, and answers flow again. With per-key limits on too, whose
    door asks the engine (it answered 500 there, and dropped connections, before)."""
    flags = ["--workers", "2", "--access-log", "false"]
    headers = None
    if limits == "on":
        keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
        flags += ["--api-keys-file", str(keys), "--key-requests-per-s", "5000"]
        headers = bearer(ALICE)
    s = ServerProcess(onnx_export, tmp_path, *flags, log_level="info")
    with s:
        assert s.proc is not None
        supervisor = s.proc.pid
        (engine,) = engines(supervisor)
        states: list[str] = []
        with ClosedLoop(s.url, 6, headers) as clients:
            time.sleep(1.0)
            os.kill(engine, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while not (states and states[-1] == "ready" and "engine_unavailable" in states):
                assert time.monotonic() < deadline, (states[-5:], s.log()[-3000:])
                r = httpx.get(s.url + "/readyz", timeout=5)
                states.append(r.json()["status"] if r.status_code == 503 else "ready")
                time.sleep(0.05)
            time.sleep(1.0)
        answered = clients.outcomes.pop("200", 0)
        assert answered > 0 and "engine_unavailable" in states
        refused = {o.split(" retry-after=")[0] for o in clients.outcomes}
        assert refused <= {"503 engine_unavailable", "503 not_ready"}, clients.outcomes
        assert all(o.endswith("retry-after=1") for o in clients.outcomes), clients.outcomes
        (restarted,) = engines(supervisor)
        assert restarted != engine and "the engine exited with signal SIGKILL" in s.log()
        assert httpx.post(s.url + "/answer", json=OK, headers=headers, timeout=10).status_code == 200


def test_limits_are_one_set_for_the_host_even_when_a_front_is_killed(
    onnx_export: Path, tmp_path: Path
) -> None:
    """A daily quota of 5 with two fronts serves exactly 5 (not 5 per front); a front killed -9 under
    load loses only its own open connections (its clients see them close), and the count goes on."""
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    flags = ["--workers", "2", "--api-keys-file", str(keys), "--key-daily-requests", "5"]
    with ServerProcess(onnx_export, tmp_path, *flags, "--access-log", "false") as s:
        statuses = [
            httpx.post(
                s.url + "/answer", json=OK, headers=bearer(ALICE) | {"Connection": "close"}
            ).status_code
            for _ in range(10)
        ]
        assert statuses == [200] * 5 + [429] * 5, statuses
    flags = ["--workers", "2", "--api-keys-file", str(keys), "--key-daily-requests", "60"]
    with ServerProcess(onnx_export, tmp_path, *flags, "--access-log", "false") as s:
        assert s.proc is not None
        with ClosedLoop(s.url, 6, headers=bearer(ALICE)) as clients:
            until(lambda: sum(clients.outcomes.values()) >= 20, "no traffic", 20.0, s.log)
            os.kill(min(fronts(s.proc.pid)), signal.SIGKILL)
            until(lambda: clients.outcomes["429"] >= 6, "the quota never ran out", 30.0, s.log)
        served, closed = clients.outcomes["200"], sum(v for k, v in clients.outcomes.items() if "Error" in k)
        assert set(clients.outcomes) <= {"200", "429", "RemoteProtocolError", "ReadError", "ConnectError"}
        # one count for the host: the 200s and the connections the killed front held make up the 60
        assert served <= 60 and served + closed >= 60 - 6, clients.outcomes


def test_fronts_still_waiting_for_the_engine_stop_at_once_on_sigterm(
    onnx_export: Path, tmp_path: Path
) -> None:
    """SIGTERM while the engine loads (no front has taken a connection yet) ends the server within
    seconds, not after the load."""
    flags = ["--workers", "2", "--warmup-delay-s", "120", "--access-log", "false"]
    s = ServerProcess(onnx_export, tmp_path, *flags, log_level="info").launch()
    try:
        assert s.proc is not None
        loading = "onnxruntime "  # the backend's line: the model is loaded, the warm-up sleep begins
        until(lambda: s.log().count(loading) == 1, "the engine never began loading", 60.0, s.log)
        began = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 0, s.log()
        assert time.monotonic() - began < 10.0
    finally:
        s.stop()


def test_an_engine_load_over_the_load_timeout_stops_the_server(onnx_export: Path, tmp_path: Path) -> None:
    flags = ["--workers", "2", "--warmup-delay-s", "120", "--load-timeout-s", "1"]
    s = ServerProcess(onnx_export, tmp_path, *flags).launch()
    try:
        assert s.proc is not None
        assert s.proc.wait(60) == 1, s.log()
    finally:
        s.stop()
    assert "took longer than 1 s" in s.log() and "model failed to load in the engine" in s.log()


def test_a_front_waiting_for_an_engine_stops_when_the_engine_marks_its_load_failed(
    onnx_export: Path, tmp_path: Path, monkeypatch
) -> None:
    """An engine whose model fails exits without a word to the fronts, and the supervisor's SIGTERM can
    reach a front before it listens for one: a front waiting for the engine reads the engine's
    load-failed mark and fails too, instead of waiting for an engine that will never come."""
    import asyncio

    from server.answering.model_spec import resolve_spec
    from server.observability.metrics import MULTIPROC_ENV, Metrics
    from server.settings import ServerSettings
    from server.topology.front import FrontLifecycle

    shared = tmp_path / "metrics"
    shared.mkdir()
    monkeypatch.setenv(MULTIPROC_ENV, str(shared))
    fatal: list[bool] = []
    front = FrontLifecycle(
        ServerSettings(model=onnx_export), resolve_spec(onnx_export, "onnx"), Metrics(),
        f"ipc://{tmp_path}/no-engine.sock", on_fatal=lambda: fatal.append(True),
    )  # fmt: skip

    async def scenario() -> str:
        await front.start()
        await asyncio.sleep(1.5)
        waiting = front.state  # no engine there: still waiting, not failed
        Metrics.mark_load_failed()  # what the engine does when its model fails
        await asyncio.wait_for(front.until_loaded(), 5.0)
        await front.stop()
        return waiting

    assert asyncio.run(scenario()) == "waiting for the engine"
    assert fatal == [True] and front.state == "failed"
