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
    """Measured on the shipped model, 1 thread (BENCHMARKS.md machine V): no group of 2 saves a fifth at
    any length, so no window is grouped; an H200's CUDA graph saves most of a call at every length, so
    all are; in between, windows up to the longest length at which both groups paid are grouped."""
    cpu = Grouping(
        (
            BatchCurve(64, 2, 0.00142, 0.00236),
            BatchCurve(64, 8, 0.00138, 0.00882),
            BatchCurve(96, 2, 0.00220, 0.00381),
            BatchCurve(96, 8, 0.00225, 0.01419),
            BatchCurve(192, 2, 0.00478, 0.00882),
            BatchCurve(192, 8, 0.00497, 0.03624),
        )
    )
    assert cpu.curves[0].saving == pytest.approx(0.169, abs=0.001)
    assert cpu.solo_from() == 1  # a pair of 64-token windows saves 17%: grouping never pays here
    gpu = Grouping((BatchCurve(48, 2, 0.00090, 0.00095), BatchCurve(384, 8, 0.00101, 0.00383)))
    assert gpu.solo_from() is None
    between = Grouping(
        (
            BatchCurve(24, 2, 0.001, 0.0012),  # 40% saved
            BatchCurve(24, 8, 0.001, 0.003),
            BatchCurve(48, 2, 0.001, 0.0015),  # 25%
            BatchCurve(48, 8, 0.001, 0.004),
            BatchCurve(96, 2, 0.001, 0.0018),  # 10%: windows of 49+ tokens run alone
            BatchCurve(96, 8, 0.001, 0.005),
        )
    )
    assert between.solo_from() == 49 and between.describe()["solo_from_tokens"] == 49
    assert BatchCurve(128, 8, 0.001, 0.009).saving < 0  # slower in a batch: a negative saving


def test_grouping_is_measured_at_lengths_up_to_the_longest_and_never_below_the_shortest() -> None:
    calls: list[tuple[int, int]] = []

    def run(batch: dict) -> None:
        calls.append(batch["input_ids"].shape)

    def batch(n: int, length: int) -> dict:
        import numpy as np

        return {"input_ids": np.zeros((n, length), dtype=np.int64)}

    measured = measure_grouping(run, batch, 192, 8, shortest=30, repeats=1)
    assert measured.lengths == [30, 48, 96, 192]
    assert sorted({c.size for c in measured.curves}) == [2, 8]
    assert {shape for shape in calls} == {(n, length) for length in (30, 48, 96, 192) for n in (1, 2, 8)}


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
