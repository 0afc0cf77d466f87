"""Whether grouping windows pays, measured at load (server/answering/batch_curve.py): the arithmetic on its own,
then a real server (uvicorn in this process) over backends whose cost is known: one all arithmetic (a
window of 128 tokens costs what it costs alone in any batch: windows run one per call), one mostly a
call's overhead (a GPU's shape: windows are grouped), and ``--batching always`` grouping regardless."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from hostile_server import app_server
from server_helpers import dev_questions

from server.answering.batch_curve import BatchCurve, Grouping, measure_grouping
from server.observability.metrics import sample_total


def test_the_measured_saving_at_each_length_decides_which_windows_run_alone() -> None:
    """Measured on the shipped model, 1 thread (docs/bench/request-path-4/grouping-shipped-1.json): groups
    of 2 and 8 save a fifth at 24 tokens, a pair only 14% at 48, so windows of 25 tokens or more run
    alone; where every group pays at every length (a GPU's shape) all are grouped; where a group pays
    too little at the shortest length, or nothing was measured, none is."""
    cpu = Grouping(
        (
            BatchCurve(24, 2, 0.000615, 0.000959),
            BatchCurve(24, 8, 0.000607, 0.003015),
            BatchCurve(48, 2, 0.000961, 0.00165),
            BatchCurve(48, 8, 0.000967, 0.005847),
            BatchCurve(96, 2, 0.001826, 0.003364),
            BatchCurve(192, 8, 0.004054, 0.033392),
        )
    )
    assert cpu.curves[0].saving == pytest.approx(0.22, abs=0.001)
    assert cpu.curves[-1].saving < 0  # eight of 192 tokens cost more as one call than one by one
    assert cpu.solo_from() == 25 and cpu.describe()["solo_from_tokens"] == 25
    gpu = Grouping(
        (
            BatchCurve(48, 2, 0.00090, 0.00095),
            BatchCurve(48, 8, 0.00090, 0.00120),
            BatchCurve(384, 2, 0.00101, 0.00130),
            BatchCurve(384, 8, 0.00101, 0.00383),  # an H200's CUDA graph (BENCHMARKS)
        )
    )
    assert gpu.solo_from() is None
    pair_short = Grouping((BatchCurve(48, 2, 0.001, 0.0017), BatchCurve(48, 8, 0.001, 0.004)))
    assert pair_short.solo_from() == 1  # eight save half, a pair 15%: a window at light load would wait
    assert Grouping(()).solo_from() == 1


def test_grouping_is_measured_shortest_first_and_stops_where_it_stops_paying() -> None:
    """The lengths: the longest / 8, / 4, / 2 and itself, as the batcher pads them, never below the
    engine's shortest or the 4 tokens of the smallest batch; measuring stops at the first group that
    does not pay (a CPU load times a short length or two), and a larger group only where the pair paid."""
    import numpy as np

    from server.answering.batch_curve import measured_lengths

    assert measured_lengths(192) == [24, 48, 96, 192]
    assert measured_lengths(192, shortest=30) == [30, 48, 96, 192]
    assert measured_lengths(192, multiple_of=64) == [64, 128, 192]
    assert measured_lengths(16) == [4, 8, 16]

    def costing(overhead_s: float, per_token_s: float, calls: list):
        def run(batch: dict) -> None:
            calls.append(batch["input_ids"].shape)
            time.sleep(overhead_s + per_token_s * batch["input_ids"].size)

        return run

    def batch(n: int, length: int) -> dict:
        return {"input_ids": np.zeros((n, length), dtype=np.int64)}

    # the fastest of three calls each (as at load): a loaded machine's hiccups only ever add to a call
    arithmetic: list = []  # a window costs its tokens, nothing more: the first pair saves nothing
    measured = measure_grouping(costing(0.0, 2e-4, arithmetic), batch, 192, 8, repeats=3)
    assert measured.lengths == [24] and [c.size for c in measured.curves] == [2]
    assert set(arithmetic) == {(1, 24), (2, 24)} and measured.solo_from() == 1
    overhead: list = []  # a call's overhead dwarfs its tokens: every group pays at every length
    measured = measure_grouping(costing(0.01, 1e-8, overhead), batch, 192, 8, repeats=3)
    assert measured.lengths == [24, 48, 96, 192] and measured.solo_from() is None
    assert set(overhead) == {(n, length) for length in (24, 48, 96, 192) for n in (1, 2, 8)}


def costing(overhead_s: float, per_token_s: float) -> Callable:
    """A backend factory: the real model's outputs, each call taking ``overhead + per_token x tokens``."""
    from server.backends import create_backend

    def factory(spec, settings):
        backend = create_backend(spec, settings)
        run = backend.run

        def timed(batch):
            start = time.perf_counter()
            out = run(batch)
            left = overhead_s + per_token_s * batch["input_ids"].size - (time.perf_counter() - start)
            if left > 0:
                time.sleep(left)
            return out

        backend.run = timed
        return backend

    return factory


def calls_for_concurrent_questions(url: str) -> tuple[float, float]:
    """Windows and backend calls for 16 one-window questions sent at once."""
    pairs = [(q, c[:150]) for q, c in dev_questions()[:16]]
    before = httpx.get(url + "/metrics").text

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            return await asyncio.gather(
                *(c.post("/answer", json={"question": q, "context": x}) for q, x in pairs)
            )

    assert all(r.status_code == 200 for r in asyncio.run(fire()))
    after = httpx.get(url + "/metrics").text
    windows = sample_total(after, "xlnetqa_batch_size_sum") - sample_total(before, "xlnetqa_batch_size_sum")
    calls = sample_total(after, "xlnetqa_batch_size_count") - sample_total(before, "xlnetqa_batch_size_count")
    return windows, calls


@pytest.mark.parametrize(
    ("cost", "batching", "grouped"),
    [
        ((0.0, 2e-5), "measured", False),  # all arithmetic: one window per call
        ((0.02, 1e-7), "measured", True),  # mostly overhead: grouped
        ((0.0, 2e-5), "always", True),  # told to group
    ],
    ids=["arithmetic", "overhead", "always"],
)
def test_windows_are_grouped_only_where_the_measured_saving_pays(
    onnx_export: Path, cost: tuple[float, float], batching: str, grouped: bool
) -> None:
    factory = costing(*cost)
    with app_server(onnx_export, factory, batching=batching, max_batch_delay_ms=5, inference_workers=2) as (
        url,
        app,
    ):
        facts = httpx.get(url + "/v1/model").json()
        windows, calls = calls_for_concurrent_questions(url)
    assert windows == 16
    if grouped:
        assert calls < windows
    else:
        assert calls == windows
    measured = app.state.runtime.batch_curve
    if batching == "measured":
        assert (
            measured is not None and facts["batching"]["measured"]["solo_from_tokens"] == measured.solo_from()
        )
        assert (measured.solo_from() is None) == grouped
    else:
        assert measured is None
