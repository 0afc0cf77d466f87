"""A ``--limits-redis`` store that fails after the start never stops or stalls the service: gone,
read-only after a failover (READONLY), out of memory (OOM) or paused under load, the server keeps
answering within the same limits, enforced by each replica on its own (never unlimited, never a 500),
says so in one log line and in ``xlnetqa_limits_store_up``, and shares them through the store again
once it answers, with what it admitted meanwhile added to the shared count. In one process and with
the engine process (where a store error used to end the engine and, taken for a failed load, the
whole server). Against a real ``redis-server``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from auth_helpers import ALICE, bearer, keys_file, until
from server_helpers import OK, ServerProcess

from bench.limits_store import scenario
from harness.redis_store import REDIS, SKIP_REASON, RedisStore
from server.limits.quotas_redis import BREAKER_COOLDOWN_S
from server.observability.metrics import sample_total

pytestmark = pytest.mark.skipif(REDIS is None, reason=SKIP_REASON)
MODES = {"one process": (), "engine process": ("--engine-process",)}


@pytest.fixture
def store() -> Iterator[RedisStore]:
    with RedisStore() as running:
        yield running


def ask(url: str, n: int) -> list[int]:
    return [
        httpx.post(url + "/answer", json=OK, headers=bearer(ALICE), timeout=30).status_code for _ in range(n)
    ]


def metric(url: str, name: str, **labels: str) -> float:
    """From ``/metrics``, open to scrapers here (--auth-metrics false: a key's scrapes would use its quota)."""
    return sample_total(httpx.get(url + "/metrics", timeout=10).text, name, **labels)


def keyed(tmp_path: Path) -> list[str]:
    """Alice's key, and /metrics open to scrapers."""
    return [
        "--api-keys-file",
        str(keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")),
        "--auth-metrics",
        "false",
    ]


def shared_count(store: RedisStore) -> str:
    """Alice's count of today in the store."""
    (day_key,) = store.cli("--scan", "--pattern", "xlnetqa:limits:alice:day:*").split()
    return store.cli("get", day_key)


FAILURES: dict[str, tuple[Callable[[RedisStore], None], str]] = {
    "read-only": (RedisStore.read_only, "ReadOnlyError"),
    "out of memory": (RedisStore.out_of_memory, "OutOfMemoryError"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("failure", FAILURES)
def test_a_store_that_refuses_writes_leaves_each_replica_its_own_limits(
    onnx_export: Path, tmp_path: Path, store: RedisStore, mode: str, failure: str
) -> None:
    """A daily quota of 4: two requests counted in the store; the store refuses every write; the
    replica serves the next two from the count the store last gave it, refuses the fifth (429, never a
    500), stays up, and says why; healed, the store gets the two it missed."""
    fail, error = FAILURES[failure]
    flags = [
        *keyed(tmp_path),
        "--key-daily-requests",
        "4",
        "--limits-redis",
        store.url,
        *MODES[mode],
    ]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        assert ask(s.url, 2) == [200, 200] and shared_count(store) == "2"
        fail(store)
        assert ask(s.url, 3) == [200, 200, 429]
        assert s.proc is not None and s.proc.poll() is None
        assert httpx.get(s.url + "/readyz", timeout=10).status_code == 200
        assert metric(s.url, "xlnetqa_limits_store_up") == 0
        assert metric(s.url, "xlnetqa_limits_store_errors_total", error=error) >= 1
        assert "the limits store failed" in s.log() and "Traceback" not in s.log()
        store.writable()
        time.sleep(BREAKER_COOLDOWN_S + 0.2)
        assert ask(s.url, 1) == [429]  # the store again: 2 + the 2 it missed = the quota
        assert shared_count(store) == "4"
        until(lambda: metric(s.url, "xlnetqa_limits_store_up") == 1, "the store never came back", 10)
        assert "the limits store answers again" in s.log()


@pytest.mark.parametrize("mode", MODES)
def test_a_store_that_goes_away_leaves_each_replica_its_own_limits(
    onnx_export: Path, tmp_path: Path, store: RedisStore, mode: str
) -> None:
    flags = [
        *keyed(tmp_path),
        "--key-daily-requests",
        "3",
        "--limits-redis",
        store.url,
        *MODES[mode],
    ]
    with ServerProcess(onnx_export, tmp_path, *flags) as s:
        assert ask(s.url, 2) == [200, 200]
        store.stop()
        assert ask(s.url, 3) == [200, 429, 429]  # not unlimited: the quota holds here
        assert s.proc is not None and s.proc.poll() is None
        assert metric(s.url, "xlnetqa_limits_store_up") == 0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@pytest.mark.parametrize("mode", MODES)
def test_a_paused_store_stalls_nothing_under_load(onnx_export: Path, tmp_path: Path, mode: str) -> None:
    """Redis stopped dead (SIGSTOP) for 6 s under six clients (bench.limits_store's scenario): the keyless
    probe's p99 stays under 1 s (the Kubernetes probes give up at 3 s), the key holder's p50 under 200 ms,
    throughput at least a quarter of what it was, every answer a 200, the server up; resumed, the store is
    used again."""
    row = scenario("paused", mode, onnx_export, tmp_path, warm_s=3.0, fail_s=6.0)
    before, during = row["before"], row["during"]
    assert set(during["statuses"]) == {"200"} and set(during["probe_statuses"]) == {"200"}, during
    assert during["answers_per_s"] >= before["answers_per_s"] / 4, (before, during)
    assert during["probe_p99_ms"] <= 1000 and during["p50_ms"] <= 200, during
    assert row["server_up_after"]
