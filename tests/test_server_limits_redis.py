"""Per-key limits shared through a real Redis (``--limits-redis``): two servers, or fronts over an engine,
count one daily quota; it survives a restart; a store that does not answer at start stops the start;
its password never reaches a command line. (What a store that fails later does to the service:
test_limits_store_failures.py.) Needs Debian's ``redis-server`` (``make test`` installs it as root;
elsewhere these tests skip, saying why)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from auth_helpers import ALICE, BOB, bearer, keys_file
from module_runs import run_module
from server_helpers import OK, ServerProcess, server_env

from harness.redis_store import REDIS, SKIP_REASON, RedisStore

pytestmark = pytest.mark.skipif(REDIS is None, reason=SKIP_REASON)
PASSWORD = "store-secret-5f0c2a9e71d84b36"


@pytest.fixture
def store() -> Iterator[RedisStore]:
    with RedisStore() as running:
        yield running


def statuses(urls: list[str], n: int, key: str = ALICE) -> list[int]:
    """``n`` requests, sent to ``urls`` in turn."""
    return [
        httpx.post(urls[i % len(urls)] + "/answer", json=OK, headers=bearer(key), timeout=30).status_code
        for i in range(n)
    ]


def test_two_servers_sharing_one_redis_serve_a_daily_quota_once(
    onnx_export: Path, tmp_path: Path, store: RedisStore
) -> None:
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    flags = ["--api-keys-file", str(keys), "--key-daily-requests", "5", "--limits-redis", store.url]
    with ServerProcess(onnx_export, tmp_path, *flags) as a, ServerProcess(onnx_export, tmp_path, *flags) as b:
        got = statuses([a.url, b.url], 10)
        assert got == [200] * 5 + [429] * 5, got
        assert statuses([b.url], 1, BOB) == [200]  # another key is counted apart
    # The quota outlives the servers: a fresh one (a restart, a new replica) finds it used up.
    with ServerProcess(onnx_export, tmp_path, *flags) as c:
        assert statuses([c.url], 1) == [429]


def test_fronts_over_an_engine_count_the_redis_quota_once(
    onnx_export: Path, tmp_path: Path, store: RedisStore
) -> None:
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    flags = ["--api-keys-file", str(keys), "--key-daily-requests", "5", "--limits-redis", store.url]
    with ServerProcess(onnx_export, tmp_path, *flags, "--workers", "2") as s:
        # a new connection each time: the kernel spreads them over both fronts
        got = [
            httpx.post(
                s.url + "/answer", json=OK, headers=bearer(ALICE) | {"Connection": "close"}, timeout=30
            ).status_code
            for _ in range(10)
        ]
    assert got == [200] * 5 + [429] * 5, got


def test_a_store_that_does_not_answer_stops_the_start(onnx_export: Path, tmp_path: Path) -> None:
    gone = tmp_path / "nothing-listens-here.sock"
    r = run_module(
        "server", "--model", onnx_export, "--limits-redis", f"unix://{gone}", "--key-daily-requests", "5",
        env=server_env(), timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "--limits-redis: the store does not answer" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def command_lines(root: int) -> list[bytes]:
    """The command lines of ``root`` and every process below it (what ``ps`` shows every local user)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    lines = []
    for pid in tree:
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
    return lines


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_stores_password_never_reaches_a_command_line(
    onnx_export: Path, tmp_path: Path, workers: str
) -> None:
    """A password in the --limits-redis flag is refused (ps shows flags to every local user); from the
    environment, or from a private file, it reaches Redis (the quota is counted there) and no command line
    of the server or of any process it started (fronts, engine) holds it."""
    with RedisStore(password=PASSWORD) as store:
        r = run_module(
            "server", "--model", onnx_export, "--limits-redis", store.url, env=server_env(), timeout=60
        )
        assert r.returncode == 2 and "holds a password" in r.stderr and PASSWORD not in r.stderr, r.stderr
        keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
        secret = keys_file(tmp_path / "redis-password", PASSWORD)
        ways = [
            ((), {"XLNETQA_LIMITS_REDIS": store.url}),
            (("--limits-redis", store.url_without_password, "--limits-redis-password-file", str(secret)), {}),
        ]
        for flags, env in ways:
            store.cli("flushall")
            common = ["--api-keys-file", str(keys), "--key-daily-requests", "5", "--workers", workers]
            with ServerProcess(onnx_export, tmp_path, *common, *flags, env=env) as s:
                assert s.proc is not None
                assert statuses([s.url], 2) == [200, 200]
                lines = command_lines(s.proc.pid)
                assert len(lines) >= (3 if workers == "2" else 1), lines
                assert not [line for line in lines if PASSWORD.encode() in line]
            day_keys = store.cli("--scan", "--pattern", "xlnetqa:limits:alice:day:*").split()
            assert len(day_keys) == 1 and store.cli("get", day_keys[0]) == "2", day_keys
        secret.chmod(0o644)  # a password file others may read is refused, as a keys file is
        r = run_module(
            "server", "--model", onnx_export, "--limits-redis", store.url_without_password,
            "--limits-redis-password-file", str(secret), "--key-daily-requests", "5", env=server_env(), timeout=60,
        )  # fmt: skip
        assert r.returncode == 2 and "the Redis password file is readable by other users" in r.stderr, (
            r.stderr
        )
