"""The answerability model travels unchanged: checkpoint metadata -> train.evaluate -> export sidecar
-> server (onnx and torch backends) -> SDK, and into a Triton repository's sidecar. Every value is
non-default (a fitted verifier, Platt calibration, a threshold that is not 0.5), so a hop that fell
back to sigmoid(cls) at 0.5 would fail here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from paths import REPO
from server_helpers import ServerProcess, export_onnx, server_env

from clients import XLNetQAClient
from qa_core.runtime.sidecar import Sidecar, SidecarError
from qa_core.squad import read_squad
from qa_core.squad.answerability import (
    QUESTION_FEATURES,
    VERIFIER_LOGIT,
    Answerability,
    Linear,
    from_metadata,
)
from train.evaluation.predict import redecide
from train.experiments.heldout import predict_file

QUESTIONS = 40


def _answerability(threshold: float) -> Answerability:
    """Non-default numbers: a question verifier leaning on coverage and negation, combined with cls."""
    coef = np.zeros(len(QUESTION_FEATURES))
    coef[QUESTION_FEATURES.index("best_sentence_coverage")] = 1.5
    coef[QUESTION_FEATURES.index("question_negated")] = -0.8
    verifier = Linear(QUESTION_FEATURES, (0.5,) * len(coef), (0.3,) * len(coef), tuple(coef), 0.1)
    model = Linear((VERIFIER_LOGIT, "cls_logit"), (0.0, 0.0), (1.0, 2.0), (1.2, -0.7), -0.2)
    return Answerability(model, verifier, "platt", (-0.9, 0.15), threshold=threshold, report={"kind": "test"})


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory, qa_checkpoint: Path, sample_dir: Path) -> Path:
    """The tiny checkpoint with a stored answerability whose threshold splits the sample's questions."""
    ckpt = tmp_path_factory.mktemp("handoff") / "ckpt"
    shutil.copytree(qa_checkpoint, ckpt)
    examples = read_squad(sample_dir / "dev.json")[:QUESTIONS]
    held = predict_file(ckpt, examples)
    probe = redecide(examples, held.predictions, _answerability(0.5))
    threshold = float(np.median([p.no_answer_prob for p in probe.values()]))  # answers about half
    meta = json.loads((ckpt / "metadata.json").read_text())
    meta["answerability"] = _answerability(threshold).to_dict()
    (ckpt / "metadata.json").write_text(json.dumps(meta))
    return ckpt


def _expected(ckpt: Path, sample_dir: Path):
    examples = read_squad(sample_dir / "dev.json")[:QUESTIONS]
    rule = from_metadata(json.loads((ckpt / "metadata.json").read_text()))
    return examples, redecide(examples, predict_file(ckpt, examples).predictions, rule), rule


def test_evaluate_applies_the_stored_answerability(
    calibrated: Path, sample_dir: Path, tmp_path: Path
) -> None:
    examples, want, rule = _expected(calibrated, sample_dir)
    assert rule.threshold != 0.5 and {p.is_impossible for p in want.values()} == {True, False}
    data = tmp_path / "dev40.json"
    dataset = json.loads((sample_dir / "dev.json").read_text())
    ids = {ex.qas_id for ex in examples}
    for article in dataset["data"]:
        for para in article["paragraphs"]:
            para["qas"] = [q for q in para["qas"] if q["id"] in ids]
    data.write_text(json.dumps(dataset))
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "train.evaluate", "--checkpoint", str(calibrated), "--data", str(data)]
    r = subprocess.run([*cmd, "--out", str(out), "--no-progress"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning:" not in r.stderr  # nothing was fitted on these articles
    got = json.loads((out / "decisions.json").read_text())
    assert set(got) == set(want)
    for q, p in want.items():
        assert got[q]["answerable_prob"] == pytest.approx(p.answerable_prob, abs=1e-9)
        assert (
            got[q]["threshold"] == pytest.approx(rule.threshold)
            and got[q]["is_impossible"] == p.is_impossible
        )
    assert json.loads((out / "metrics.json").read_text())["threshold"] == pytest.approx(rule.threshold)
    # --answerability cls ignores the fitted model and decides by sigmoid(cls) at the stored 0.5
    r = subprocess.run(
        [*cmd, "--out", str(tmp_path / "cls"), "--no-progress", "--answerability", "cls"], cwd=REPO
    )
    assert r.returncode == 0
    cls = json.loads((tmp_path / "cls" / "decisions.json").read_text())
    assert {v["threshold"] for v in cls.values()} == {0.5}
    # scored on the articles its decision was fitted on (or it was fine-tuned on): said, not hidden
    seen = tmp_path / "seen"
    shutil.copytree(calibrated, seen)
    meta = json.loads((seen / "metadata.json").read_text())
    meta["answerability"]["report"] = {"fitted_on": {"articles": ["1973_oil_crisis"]}}
    meta["fine_tuned_on_articles"] = ["1973_oil_crisis", "Normans"]
    (seen / "metadata.json").write_text(json.dumps(meta))
    cmd[cmd.index(str(calibrated))] = str(seen)
    r = subprocess.run(
        [*cmd, "--out", str(tmp_path / "seen-eval"), "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert (
        len(warnings) == 2 and "fine-tuned on" in warnings[0] and "fit the no-answer decision" in warnings[1]
    )
    assert json.loads((tmp_path / "seen-eval" / "metrics.json").read_text())["in_sample"] == [
        w.removeprefix("warning: ") for w in warnings
    ]


@pytest.fixture(scope="module")
def calibrated_export(calibrated: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(calibrated, tmp_path_factory.mktemp("handoff_export") / "export")


def test_export_sidecar_and_triton_repository_carry_it(
    calibrated: Path, calibrated_export: Path, tmp_path: Path
) -> None:
    stored = json.loads((calibrated / "metadata.json").read_text())["answerability"]
    side = Sidecar.load(calibrated_export)
    assert side.answerability == stored and side.decision() == Answerability.from_dict(stored)
    repo = tmp_path / "triton"
    cmd = [sys.executable, "-m", "export.triton", "--onnx", str(calibrated_export), "--out", str(repo)]
    r = subprocess.run([*cmd, "--instance-kind", "cpu"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sidecars = list(repo.glob("*/export.json"))
    assert len(sidecars) == 1 and json.loads(sidecars[0].read_text())["answerability"] == stored
    # a sidecar with broken answerability numbers is refused with the reason
    broken = tmp_path / "broken"
    shutil.copytree(calibrated_export, broken)
    data = json.loads((broken / "export.json").read_text())
    data["answerability"]["model"]["coef"] = [1.0]
    (broken / "export.json").write_text(json.dumps(data))
    with pytest.raises(SidecarError, match="answerability.model.coef"):
        Sidecar.load(broken)
    r = subprocess.run(
        [sys.executable, "-m", "server", "--model", str(broken), "--port", "0"],
        cwd=REPO, capture_output=True, text=True, env=server_env(), timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "answerability.model.coef" in r.stderr and r.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_server_and_sdk_return_the_same_decisions(
    backend: str, calibrated: Path, calibrated_export: Path, sample_dir: Path, tmp_path: Path
) -> None:
    examples, want, rule = _expected(calibrated, sample_dir)
    model = calibrated_export if backend == "onnx" else calibrated
    server = ServerProcess(model, tmp_path, backend=backend).start()
    try:
        with XLNetQAClient(server.url, timeout=30) as qa:
            info = qa.model_info()
            assert info.answerability is not None
            assert info.answerability["kind"] == "fitted" and info.answerability["rule"] == "threshold"
            assert info.answerability["threshold"] == pytest.approx(rule.threshold)
            assert info.answerability["features"] == [VERIFIER_LOGIT, "cls_logit"]
            for ex in examples:
                a, p = qa.answer(ex.question, ex.context), want[ex.qas_id]
                assert a.answerable_prob == pytest.approx(p.answerable_prob, abs=1e-4)
                assert a.no_answer_prob == pytest.approx(p.no_answer_prob, abs=1e-4)
                assert a.threshold == pytest.approx(rule.threshold) and a.rule == "threshold"
                if abs(p.no_answer_prob - rule.threshold) > 1e-3:  # fp differences only matter at the edge
                    assert a.is_impossible == p.is_impossible
                assert a.best_span is not None and a.best_span.text == p.best_span_text
                assert a.answer == ("" if a.is_impossible else a.best_span.text)
            forced = qa.answer(examples[0].question, examples[0].context, threshold=1.0)
            assert forced.threshold == 1.0 and not forced.is_impossible  # a request's threshold wins
            assert forced.rule == "request"
    finally:
        server.stop()
