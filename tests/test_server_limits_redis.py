"""Per-key limits shared through a real Redis (``--limits-redis``): two servers, or fronts over an engine,
count one daily quota; it survives a restart; a store that does not answer at start stops the start,
and one that goes away later lets requests through (and says so). Needs Debian's ``redis-server``
(``make test`` installs it as root; elsewhere these tests skip, saying why)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from auth_helpers import ALICE, BOB, bearer, keys_file
from module_runs import run_module
from server_helpers import OK, ServerProcess, server_env

from harness.server_process import free_port

REDIS = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(
    REDIS is None, reason="redis-server is not installed (apt-get install redis-server)"
)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of this test's own on a free loopback port (no persistence)."""
    assert REDIS is not None
    port = free_port()
    proc = subprocess.Popen(
        [
            REDIS,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while (
            subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
            ).stdout.strip()
            != "PONG"
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def statuses(urls: list[str], n: int, key: str = ALICE) -> list[int]:
    """``n`` requests, sent to ``urls`` in turn."""
    return [
        httpx.post(urls[i % len(urls)] + "/answer", json=OK, headers=bearer(key), timeout=30).status_code
        for i in range(n)
    ]


def test_two_servers_sharing_one_redis_serve_a_daily_quota_once(
    onnx_export: Path, tmp_path: Path, redis_url: str
) -> None:
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    flags = ["--api-keys-file", str(keys), "--key-daily-requests", "5", "--limits-redis", redis_url]
    with ServerProcess(onnx_export, tmp_path, *flags) as a, ServerProcess(onnx_export, tmp_path, *flags) as b:
        got = statuses([a.url, b.url], 10)
        assert got == [200] * 5 + [429] * 5, got
        assert statuses([b.url], 1, BOB) == [200]  # another key is counted apart
    # The quota outlives the servers: a fresh one (a restart, a new replica) finds it used up.
    with ServerProcess(onnx_export, tmp_path, *flags) as c:
        assert statuses([c.url], 1) == [429]


def test_fronts_over_an_engine_count_the_redis_quota_once(
    onnx_export: Path, tmp_path: Path, redis_url: str
) -> None:
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    flags = [
        "--api-keys-file",
        str(keys),
        "--key-daily-requests",
        "5",
        "--limits-redis",
        redis_url,
        "--workers",
        "2",
    ]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        # a new connection each time: the kernel spreads them over both fronts
        got = [
            httpx.post(
                s.url + "/answer", json=OK, headers=bearer(ALICE) | {"Connection": "close"}, timeout=30
            ).status_code
            for _ in range(10)
        ]
    assert got == [200] * 5 + [429] * 5, got


def test_a_store_that_does_not_answer_stops_the_start_and_one_that_goes_away_lets_requests_through(
    onnx_export: Path, tmp_path: Path, redis_url: str
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    flags = ["--limits-redis", dead, "--key-daily-requests", "5"]
    r = run_module("server", "--model", onnx_export, *flags, env=server_env(), timeout=60)
    assert r.returncode == 2 and "--limits-redis: the store does not answer" in r.stderr, r.stderr
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    flags = ["--api-keys-file", str(keys), "--key-daily-requests", "2", "--limits-redis", redis_url]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        assert statuses([s.url], 3) == [200, 200, 429]
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=10)
        time.sleep(0.3)
        assert statuses([s.url], 2) == [200, 200]  # the store is gone: served, not refused
        assert "the limits store cannot be reached" in s.log() and "limits are not enforced" in s.log()
