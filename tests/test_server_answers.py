"""The server's answers are the evaluation path's answers, whatever it does to get them fast: every
sample question through ``POST /answer`` against ``featurize_one`` + one unpadded backend call per window
+ ``decode_head_outputs`` in-process, for the onnx and torch backends, with micro-batching on (questions
sent together, so windows share padded calls) and off, and for the shipped model, whose answerability
rule reads the context's sentences (the path the context cache and the sentence index serve)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest
from paths import REPO
from server_helpers import ServerProcess, dev_questions

from harness.server_process import LOOPBACK
from qa_core.contract import MAX_N_BEST
from qa_core.squad import DecodeOptions, decode_head_outputs, featurize_one, pad_batch
from qa_core.tokenizer import XLNetTokenizer
from server.answering.model_spec import resolve_spec
from server.backends import create_backend
from server.flags import load_settings

SHIPPED = REPO / "models" / "squad2-small-int8"
TOP_K = 5
SCORE_TOLERANCE = 1e-5
# Batched calls pad windows (fp32 logits move in the last bits), and an int8 graph quantizes its
# activations with one dynamic range per call, so a window's logits depend on its batch mates.
BATCHED_TOLERANCE = {"tiny": 1e-4, "tiny, trees": 1e-4, "shipped": None}


def reference_answers(model: Path, backend: str, questions: list[tuple[str, str]]) -> list[dict]:
    """Each question answered in-process the way evaluation does, with the backend the server builds."""
    spec = resolve_spec(model, backend)
    engine = create_backend(spec, load_settings(["--model", str(model), "--backend", backend]))
    tokenizer = XLNetTokenizer.from_dir(spec.tokenizer_dir)
    s = spec.serving
    # every span the windows give (the most a pool may be): the server lists the same first TOP_K, the
    # pool it decodes widened when spans that snap alike leave too few (tests/test_decode_bounds.py)
    pool = MAX_N_BEST
    out = []
    try:
        for question, context in questions:
            features = featurize_one(
                question, context, tokenizer, s.max_seq_len, s.doc_stride, s.max_query_len
            )
            rows = []
            for f in features:
                outputs = engine.run(pad_batch([f], pad_to=max(spec.min_engine_seq_len or 0, len(f))))
                rows.append({name: value[0] for name, value in outputs.items()})
            p = decode_head_outputs(
                spec.head, context, features, rows, DecodeOptions.spans(pool, s.max_answer_len, answerability=spec.decision),
                question=question,
            )  # fmt: skip
            out.append(
                {
                    "answer": p.text,
                    "start": p.start,
                    "end": p.end,
                    "is_impossible": p.is_impossible,
                    "no_answer_prob": p.no_answer_prob,
                    "threshold": p.threshold,
                    "n_best": [(e.text, e.start, e.end, e.score) for e in p.n_best[:TOP_K]],
                }
            )
    finally:
        engine.close()
    return out


async def served_answers(url: str, questions: list[tuple[str, str]], together: int) -> list[dict]:
    """``together`` requests in flight at a time (1: one by one)."""
    limits = httpx.Limits(max_connections=together)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        bodies = [{"question": q, "context": c, "top_k": TOP_K} for q, c in questions]
        replies = []
        for k in range(0, len(bodies), together):
            chunk = bodies[k : k + together]
            replies += await asyncio.gather(*(client.post("/answer", json=b) for b in chunk))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200][:2]
    return [r.json() for r in replies]


def assert_same(served: list[dict], reference: list[dict], tolerance: float | None) -> None:
    if tolerance is None:
        assert_agree(served, reference)
        return
    for got, want in zip(served, reference, strict=True):
        assert (got["answer"], got["start"], got["end"], got["is_impossible"]) == (
            want["answer"], want["start"], want["end"], want["is_impossible"],
        )  # fmt: skip
        assert got["no_answer_prob"] == pytest.approx(want["no_answer_prob"], abs=tolerance)
        spans = [(e["text"], e["start"], e["end"]) for e in got["n_best"]]
        assert spans == [entry[:3] for entry in want["n_best"]]
        for e, entry in zip(got["n_best"], want["n_best"], strict=True):
            assert e["score"] == pytest.approx(entry[3], abs=tolerance)


NEAR_THRESHOLD = 0.02  # the largest no-answer probability gap batching is allowed (asserted below)


def _best(answer: dict) -> tuple | None:
    spans = answer["n_best"]
    if not spans:
        return None
    first = spans[0]
    return (first["start"], first["end"]) if isinstance(first, dict) else tuple(first[1:3])


def assert_agree(served: list[dict], reference: list[dict]) -> None:
    """int8 batched (a window's quantisation range depends on its batch mates): the decision to answer
    the same on nearly every question, and where it differs either the reference sat within the allowed
    gap of its threshold or the best span moved (the expected-gain rule's threshold follows the span);
    the best span, and the answer where both answer, the same on nearly every question; the no-answer
    probability close (the export's own agreement check holds int8 to the same standard)."""
    pairs = list(zip(served, reference, strict=True))
    flipped = [(g, w) for g, w in pairs if g["is_impossible"] != w["is_impossible"]]
    explained = [
        abs(w["no_answer_prob"] - w["threshold"]) < NEAR_THRESHOLD or _best(g) != _best(w) for g, w in flipped
    ]
    both = [(g, w) for g, w in pairs if not g["is_impossible"] and not w["is_impossible"]]
    same_answer = sum(g["answer"] == w["answer"] for g, w in both)
    best = [_best(g) == _best(w) for g, w in pairs if w["n_best"]]
    gaps = [abs(g["no_answer_prob"] - w["no_answer_prob"]) for g, w in pairs]
    print(
        f"int8 batched: decisions {len(pairs) - len(flipped)}/{len(pairs)} (differing ones explained: "
        f"{sum(explained)}/{len(flipped)}), same answer where both answer {same_answer}/{len(both)}, "
        f"best span {sum(best)}/{len(best)}, max gap {max(gaps):.4f}"
    )
    assert all(explained) and len(flipped) <= 0.02 * len(pairs)
    assert same_answer >= 0.95 * len(both)
    assert sum(best) >= 0.95 * len(best)
    assert max(gaps) < NEAR_THRESHOLD


def with_trees(checkpoint: Path, folder: Path) -> Path:
    """A copy of ``checkpoint`` given a boosted-trees span re-ranker and its rule by train.calibrate."""
    from train.calibrate import main as calibrate_main

    copy = folder / "trees"
    shutil.copytree(checkpoint, copy)
    sample = REPO / "data" / "sample"
    argv = ["--checkpoint", str(copy), "--data", str(sample / "calibration.json"), "--reranker", "trees"]
    assert calibrate_main([*argv, "--train-file", str(sample / "train.json"), "--no-progress"]) == 0
    stored = json.loads((copy / "metadata.json").read_text())["answerability"]["reranker"]
    assert stored["model"]["kind"] == "boosted_trees"
    return copy


@pytest.mark.parametrize(
    ("which", "backend"),
    [("tiny", "onnx"), ("tiny", "torch"), ("tiny, trees", "torch"), ("shipped", "onnx")],
)
def test_served_answers_are_the_evaluation_paths(
    which: str, backend: str, onnx_export: Path, qa_checkpoint: Path, tmp_path: Path
) -> None:
    """The tiny model served from its export and its checkpoint, with a boosted-trees re-ranker (its
    checkpoint calibrated here), and the shipped model (a linear re-ranker and the expected-gain rule)."""
    model = {"tiny": onnx_export, "shipped": SHIPPED}.get(which) or with_trees(qa_checkpoint, tmp_path)
    questions = dev_questions()
    reference = reference_answers(model, backend, questions)
    for flags, together in ((("--max-batch-size", "1"), 1), (("--max-batch-size", "8"), 12)):
        with ServerProcess(model, tmp_path, *flags, backend=backend) as server:
            assert server.url.startswith(f"http://{LOOPBACK}")
            served = asyncio.run(served_answers(server.url, questions, together))
        assert_same(served, reference, SCORE_TOLERANCE if together == 1 else BATCHED_TOLERANCE[which])
    # The comparison has spans to compare (these models mostly answer "none", but they rank spans).
    assert sum(bool(r["n_best"]) for r in reference) > len(reference) // 2


def held_out_questions() -> list[tuple[str, str]]:
    """Every question of the shipped model's held-out articles (shipped beside it, copied unchanged)."""
    data = json.loads((SHIPPED / "heldout.json").read_text())
    return [(qa["question"], p["context"]) for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]]


def test_the_shipped_model_serves_every_held_out_question_as_evaluation_decides_it(tmp_path: Path) -> None:
    """Every question of the articles its scores are reported on, one request at a time through the real
    server: the decision, the answer and the re-ranked spans are the evaluation path's, question by question."""
    questions = held_out_questions()
    reference = reference_answers(SHIPPED, "onnx", questions)
    with ServerProcess(SHIPPED, tmp_path, "--max-batch-size", "1", backend="onnx") as server:
        served = asyncio.run(served_answers(server.url, questions, 1))
    assert_same(served, reference, SCORE_TOLERANCE)
    assert len(served) == len(questions) > 500
