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

from server.answering.batch_curve import BatchCurve
from server.observability.metrics import sample_total


def test_the_saving_of_grouping_decides_which_windows_run_alone() -> None:
    cpu = BatchCurve(
        length=192, size=8, one_s=0.00955, many_s=0.0742
    )  # measured: the shipped model, 1 thread
    assert cpu.saving(192) == pytest.approx(0.03, abs=0.01)
    assert cpu.solo_from() is not None and cpu.solo_from() < 192
    gpu = BatchCurve(length=384, size=8, one_s=0.00101, many_s=0.00383)  # an H200's CUDA graph (BENCHMARKS)
    assert gpu.saving(384) > 0.5 and gpu.solo_from() is None
    arithmetic = BatchCurve(length=128, size=8, one_s=0.001, many_s=0.008)
    assert arithmetic.overhead_s == 0 and arithmetic.solo_from() == 1
    slower_in_a_batch = BatchCurve(length=128, size=8, one_s=0.001, many_s=0.009)
    assert slower_in_a_batch.overhead_s == 0 and slower_in_a_batch.solo_from() == 1


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
