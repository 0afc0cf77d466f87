"""The micro-batcher in-process, with a stand-in backend that records the batches it is given: padding
to the longest window, grouping by length, the padding cap, the queue bound in windows, draining.
(The scheduling policy alone, with a fake clock, is in test_scheduling.py; fairness, deadlines and
failures under load through the server are in test_server_hostile_queueing.py and
test_server_hostile_failures.py.)"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from server_helpers import WINDOWS, dev_contexts

from qa_core.squad import featurize_one
from qa_core.tokenizer import XLNetTokenizer


def _features(tok: XLNetTokenizer, lengths: list[int]) -> list[list]:
    """One question per entry whose context makes a window of about that many tokens."""
    words = " ".join(dev_contexts()).split()
    return [featurize_one("Why?", " ".join(words[:n]), tok, **WINDOWS) for n in lengths]


def test_batcher_pads_to_longest_groups_windows_and_bounds_the_queue(xlnet_tok) -> None:
    from server.answering.batching import MicroBatcher, QueueFull

    seen: list[tuple[int, int]] = []

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(batch["input_ids"].shape)
        return {"total": (batch["input_ids"] * batch["attention_mask"]).sum(axis=1)}

    groups = _features(xlnet_tok, [3, 5, 4, 400])  # the last has many windows

    n_windows = sum(len(g) for g in groups)

    async def scenario() -> None:
        b = MicroBatcher(run, max_batch_size=3, max_delay_s=0.05, max_queue=n_windows)  # bound in windows
        b.start()
        results = await asyncio.gather(*(b.submit(g) for g in groups))
        for g, res in zip(groups, results, strict=True):
            assert [int(r["total"]) for r in res.rows] == [int(f.input_ids.sum()) for f in g]
            assert res.queue_s >= 0 and res.inference_s > 0
        with pytest.raises(QueueFull):
            b.submit_many([groups[0]] * (n_windows + 1))
        assert b.queued == 0
        await b.drain()
        engine_like = MicroBatcher(
            run, max_batch_size=3, max_delay_s=0.0, min_length=64
        )  # a TensorRT profile
        engine_like.start()
        await engine_like.submit(groups[0])
        await engine_like.drain()

    asyncio.run(scenario())
    assert seen.pop() == (1, 64)
    assert sum(shape[0] for shape in seen) == n_windows and max(s[0] for s in seen) <= 3
    assert len(seen) < n_windows  # windows were grouped
    # The three short questions went together, padded to the longest of them, not to max_seq_len.
    assert seen[0] == (3, max(len(g[0]) for g in groups[:3]))
    assert seen[0][1] < 64


def test_batcher_buckets_by_length_and_drains_admitted_work(xlnet_tok) -> None:
    from server.answering.batching import BatcherClosed, MicroBatcher

    shapes: list[tuple[int, int]] = []
    gate = threading.Event()

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        gate.wait(5)
        shapes.append(batch["input_ids"].shape)
        return {"n": batch["attention_mask"].sum(axis=1)}

    short, long_ = _features(xlnet_tok, [3, 25])
    assert len(long_) == 1 and len(long_[0]) > 2 * len(short[0])

    async def scenario() -> None:
        b = MicroBatcher(run, max_batch_size=2, max_delay_s=0.0, max_queue=16)
        b.start()
        first = asyncio.ensure_future(b.submit(short))  # occupies the only worker until the gate opens
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(b.submit(g)) for g in (long_, short, long_, short)]
        await asyncio.sleep(0.05)
        gate.set()
        drain = asyncio.ensure_future(b.drain(timeout=10))
        await asyncio.sleep(0)
        with pytest.raises(BatcherClosed):
            b.submit_many([short])
        await drain
        assert all(f.done() and not f.exception() for f in [first, *waiting])

    asyncio.run(scenario())
    # After the first call, the long windows were batched together and the short ones together.
    lengths = sorted(t for _, t in shapes[1:])
    assert len(shapes) == 3 and lengths[0] < lengths[1], shapes


def test_batcher_caps_padding(xlnet_tok) -> None:
    """A window joins a batch only while padding stays within max_padding of the real tokens; the one
    left out runs in the next call. (That it does not wait max_delay again, its wait counting from its
    arrival, is pinned with a fake clock in test_scheduling.py.)"""
    from server.answering.batching import MicroBatcher

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes.append(batch["input_ids"].shape)
        return {"n": batch["attention_mask"].sum(axis=1)}

    short, long_ = _features(xlnet_tok, [3, 25])
    assert 2 * len(long_[0]) > 1.25 * (len(long_[0]) + len(short[0]))  # padded together: > 25% waste

    async def scenario(max_padding: float) -> None:
        b = MicroBatcher(run, max_batch_size=4, max_delay_s=0.5, max_padding=max_padding)
        b.start()
        await asyncio.gather(b.submit(long_), b.submit(short))  # both queued before the delay ends
        await b.drain()

    shapes: list[tuple[int, int]] = []
    asyncio.run(scenario(0.25))
    assert shapes == [(1, len(long_[0])), (1, len(short[0]))]
    shapes = []
    asyncio.run(scenario(10.0))
    assert shapes == [(2, len(long_[0]))]


def test_pad_multiple_never_rounds_past_the_models_longest_input(xlnet_tok) -> None:
    """pad_multiple_of rounds a batch up, but never beyond max_length (a TensorRT profile's or the position
    tables' end): 100 tokens with multiple 96 and max 128 pad to 128, not 192; the minimum still applies."""
    from server.answering.batching import MicroBatcher

    shapes: list[tuple[int, int]] = []

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes.append(batch["input_ids"].shape)
        return {"n": batch["attention_mask"].sum(axis=1)}

    long_, short = (windows[:1] for windows in _features(xlnet_tok, [80, 1]))
    assert 96 < len(long_[0]) <= 128 and len(short[0]) < 100, (len(long_[0]), len(short[0]))

    async def scenario(features: list, **limits: int) -> None:
        b = MicroBatcher(run, max_batch_size=1, max_delay_s=0.0, pad_multiple_of=96, **limits)
        b.start()
        await b.submit(features)
        await b.drain()

    asyncio.run(scenario(long_, max_length=128))
    asyncio.run(scenario(long_))  # no cap: rounded to the multiple
    asyncio.run(scenario(short, min_length=100, max_length=128))
    assert shapes == [(1, 128), (1, 192), (1, 128)]


def test_an_idle_engine_runs_a_lone_request_at_once_and_a_busy_one_groups(xlnet_tok) -> None:
    """max_batch_delay is an upper bound, never a floor: with the engine idle a lone request runs at once
    (a 60 s delay would time this test out); while another call is in flight (two inference slots),
    windows wait for company up to the delay, and the end of that call does not hold them further."""
    from server.answering.batching import MicroBatcher

    gate = threading.Event()
    shapes: list[tuple[int, int]] = []

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not gate.is_set() and len(shapes) == 0:
            shapes.append((-1, -1))  # the first call blocks until the gate opens
            gate.wait(10)
        else:
            shapes.append(batch["input_ids"].shape)
        return {"n": batch["attention_mask"].sum(axis=1)}

    (one,) = _features(xlnet_tok, [3])

    async def idle() -> None:
        b = MicroBatcher(run, max_batch_size=8, max_delay_s=60.0)
        b.start()
        gate.set()
        res = await asyncio.wait_for(b.submit(one), 5)
        assert res.queue_s < 1.0
        await b.drain()

    async def busy() -> None:
        b = MicroBatcher(run, max_batch_size=8, max_delay_s=60.0, workers=2)
        b.start()
        first = asyncio.ensure_future(b.submit(one))  # takes one slot and blocks in the backend
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(b.submit(one))
        await asyncio.sleep(0.2)
        assert not second.done()  # a slot is free, but the engine is busy: it waits for company
        gate.set()  # the busy call ends: the engine is idle, the waiting window runs at once
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        await b.drain()

    asyncio.run(idle())
    gate.clear()
    shapes.clear()
    asyncio.run(busy())
    assert shapes[0] == (-1, -1) and shapes[1][0] == 1


def test_host_work_runs_while_the_engine_runs_once_per_question_and_never_fails_the_call(xlnet_tok) -> None:
    """``on_running`` (the request path's decision work, done while the engine runs) is called on the
    loop once the backend call holding the question's first window is in the inference thread, before
    it ends;
    once per question however many of its windows the call holds; not for a question already dead;
    and a hook that raises is logged, the call's answers unharmed."""
    from server.answering.batching import MicroBatcher

    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def run(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        started.set()
        assert release.wait(10)
        return {"n": batch["attention_mask"].sum(axis=1)}

    long, other, gone = _features(xlnet_tok, [400, 400, 400])  # alike: one backend call holds them all
    assert len(long) > 1

    async def scenario() -> None:
        b = MicroBatcher(run, max_batch_size=64, max_delay_s=0.0)
        b.start()

        def hook(name: str):
            def called() -> None:
                assert b.busy and not release.is_set(), "not while the engine's call ran"
                calls.append(name)

            return called

        def broken() -> None:
            calls.append("broken")
            raise RuntimeError("a hook that fails")

        futures = b.submit_many([long], on_running=hook("long"))
        futures += b.submit_many([other], on_running=broken)
        dead = b.submit_many([gone], on_running=hook("dead"))
        dead[0].cancel()  # gone before its window was run: no host work for it
        await asyncio.sleep(0.2)
        assert calls == ["long", "broken"]
        release.set()
        results = await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert [int(r["n"]) for r in results[0].rows] == [int(f.attention_mask.sum()) for f in long]
        assert [int(r["n"]) for r in results[1].rows] == [int(f.attention_mask.sum()) for f in other]
        await b.drain()

    asyncio.run(scenario())
    assert calls == ["long", "broken"]


def test_a_row_is_finite_exactly_when_every_value_of_its_float_outputs_is() -> None:
    """The check every answer waits for sums float32/float16 rows in float64: the largest finite values
    stay finite (no overflow), every NaN and infinity is caught, integer outputs are not read, and
    float64 outputs, which a sum could overflow, are tested value by value."""
    from server.answering.batching import _finite_rows

    rng = np.random.default_rng(0)
    for dtype in (np.float16, np.float32, np.float64):
        big = np.finfo(dtype).max
        values = rng.normal(size=(6, 3, 50)).astype(dtype)
        values[0] = big  # every value the largest finite one: a float32 or float64 sum would overflow
        values[1] = -big
        values[2, 1, 7] = np.nan
        values[3, 0, 0] = np.inf
        values[4, 2, 49] = -np.inf
        counts = np.zeros((6, 4), dtype=np.int64)
        counts[5] = np.iinfo(np.int64).max
        got = _finite_rows({"logits": values, "top_index": counts}, 6)
        assert got.tolist() == [True, True, False, False, False, True], dtype
        assert got.tolist() == np.isfinite(values.reshape(6, -1)).all(axis=1).tolist()
    assert _finite_rows({"top_index": np.zeros((2, 3), dtype=np.int64)}, 2).tolist() == [True, True]


def test_host_work_skips_a_question_dead_by_then_and_logs_a_hook_that_fails(caplog) -> None:
    """The host work handed to the loop as a call starts: a question whose future is done by the time
    the loop runs it (client gone, another window failed) gets none; a hook that raises is logged and
    the next question's still runs; each hook is taken once (a second call holding the same question
    hands over nothing)."""
    from server.answering.batching import _host_work, _Job

    loop = asyncio.new_event_loop()
    try:
        calls: list[str] = []

        def job(name: str, raises: bool = False) -> _Job:
            def hook() -> None:
                calls.append(name)
                if raises:
                    raise RuntimeError(f"{name} failed")

            return _Job([], loop.create_future(), 0.0, [], 0, 0, tag=name, on_running=hook)

        gone, broken, alive = job("gone"), job("broken", raises=True), job("alive")
        work = _host_work([(gone, 0), (broken, 0), (alive, 0)])
        assert work is not None
        gone.future.cancel()  # dead before the loop runs the work
        with caplog.at_level("ERROR", logger="server.answering.batching"):
            work()
        assert calls == ["broken", "alive"]
        assert "broken" in caplog.text and "RuntimeError" in caplog.text
        assert _host_work([(alive, 1), (broken, 1)]) is None  # taken: nothing left to hand over
    finally:
        loop.close()
