"""The server's host path: the null backend (the real path with a free engine), no idle wait in the
batcher through a live server, and the stages a response reports. (The answers themselves against the
evaluation path are in test_server_answers.py.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import OK, WINDOWS, ServerProcess, check_answer, dev_questions, stand_in_spec

from qa_core.heads import HEADS
from qa_core.squad import decode_head_outputs, featurize_one
from server.backends.base import dummy_batch


@pytest.mark.parametrize("head", HEADS)
def test_null_backend_gives_every_head_its_outputs_and_they_decode(
    head: str, xlnet_tok, tmp_path: Path
) -> None:
    from qa_core.heads import head_spec
    from server.backends.null import NullBackend

    spec = stand_in_spec(tmp_path, head=head)
    spec = type(spec)(**{**spec.__dict__, "output_names": head_spec(head).outputs})
    backend = NullBackend(spec)
    out = backend.run(dummy_batch(3, 40))
    assert tuple(out) == head_spec(head).outputs
    assert all(v.shape[0] == 3 and np.isfinite(v).all() for v in out.values())
    question, context = dev_questions()[0]
    features = featurize_one(question, context, xlnet_tok, **WINDOWS)
    rows = []
    for f in features:
        outputs = backend.run({"input_ids": f.input_ids[None, :]})
        rows.append({name: value[0] for name, value in outputs.items()})
    prediction = decode_head_outputs(head, context, features, rows, question=question)
    best = prediction.n_best[0]  # a real span of the context, mapped back to its characters
    assert context[best.start : best.end] == best.text and best.text.strip()


def test_null_backend_serves_the_real_path_and_says_what_it_is(onnx_export: Path, tmp_path: Path) -> None:
    with ServerProcess(onnx_export, tmp_path, backend="null") as server:
        question, context = dev_questions()[1]
        r = httpx.post(server.url + "/answer", json={"question": question, "context": context, "top_k": 3})
        assert r.status_code == 200, r.text
        check_answer(r.json(), context, top_k=3)
        info = httpx.get(server.url + "/v1/model").json()
        assert info["backend"] == "null" and info["runtime"]["note"].startswith("fixed outputs")
    assert "backend null: answers are a fixed pattern" in server.log()


def test_an_idle_server_answers_without_waiting_for_a_batch(onnx_export: Path, tmp_path: Path) -> None:
    """A delay of a minute is an upper bound: one client on an idle engine is answered at once."""
    with ServerProcess(onnx_export, tmp_path, "--max-batch-delay-ms", "60000", "--max-batch-size", "8") as s:
        for _ in range(3):
            r = httpx.post(s.url + "/answer", json=OK, timeout=20)
            assert r.status_code == 200, r.text
            assert r.json()["timing_ms"]["queue"] < 1000


def _stages(reply: httpx.Response) -> dict[str, float]:
    """The ``Server-Timing`` header of a reply as {stage: ms}, in the order it lists them."""
    parts = [p.strip().split(";dur=") for p in reply.headers["server-timing"].split(",")]
    return {name: float(ms) for name, ms in parts}


def test_answers_report_their_stages_and_other_replies_do_not(onnx_export: Path, tmp_path: Path) -> None:
    from server.observability.timing import STAGES

    with ServerProcess(onnx_export, tmp_path, backend="null") as server:
        one = httpx.post(server.url + "/answer", json=OK, timeout=20)
        assert one.status_code == 200, one.text
        stages = _stages(one)
        named = [s for s in stages if s != "total"]
        assert named == [s for s in STAGES if s in stages] and list(stages)[-1] == "total"
        assert {"parse", "featurize", "queue", "engine", "decode", "serialize"} <= set(named)
        assert all(ms >= 0 for ms in stages.values())
        assert sum(stages[s] for s in named) <= stages["total"]  # the named stages lie within the total
        batch = httpx.post(server.url + "/answer/batch", json={"items": [OK, OK]}, timeout=20)
        assert batch.status_code == 200, batch.text
        assert {"parse", "featurize", "engine", "serialize", "total"} <= set(_stages(batch))
        probe, invalid = httpx.get(server.url + "/healthz"), httpx.post(server.url + "/answer", json={})
        assert (probe.status_code, invalid.status_code) == (200, 422)
        assert "server-timing" not in probe.headers and "server-timing" not in invalid.headers
