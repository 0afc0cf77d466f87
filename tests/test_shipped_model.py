"""The model shipped in `models/`: what `make demo` serves in its first minute.

Its provenance must hold (held-out articles disjoint from everything it was trained, calibrated or
chosen on; the demo's questions drawn from the held-out ones), the server must load it with every file's
hash checked, and the served answers must be the ones recorded when it was made.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from paths import REPO

import demo
from qa_core.squad import read_squad

SHIPPED = REPO / "models" / "squad2-small-int8"
SHARED_LABELLED = REPO.parent / "shared" / "data" / "squad2" / "dev-v2.0.cs224n-13.json"


def provenance() -> dict:
    return json.loads((SHIPPED / "provenance.json").read_text())


def test_the_held_out_articles_are_disjoint_from_everything_fitted() -> None:
    p = provenance()
    held_out, trained, calibration = (
        set(p["articles"][k]) for k in ("held_out", "fine_tuned", "calibration")
    )
    assert held_out and trained and calibration
    assert not held_out & (trained | calibration)
    # a rule fitted on out-of-fold outputs (train.crossfit) reads articles the shipped reader trained on,
    # each through a fold reader that never did; fitted on the reader's own outputs, they must be others
    if not p["articles"].get("calibration_out_of_fold"):
        assert not trained & calibration
    assert set(p["held_out"]["articles"]) == held_out
    asked = {a["title"] for a in json.loads((SHIPPED / "questions.json").read_text())["data"]}
    assert asked <= held_out
    scored = {a["title"] for a in json.loads((SHIPPED / "heldout.json").read_text())["data"]}
    assert scored == held_out
    # the sample's calibration articles: development (make demo, the tests) fits answerability on them,
    # so they are never scored
    calibration = {
        a["title"] for a in json.loads((REPO / "data" / "sample" / "calibration.json").read_text())["data"]
    }
    assert not held_out & calibration


@pytest.mark.skipif(not SHARED_LABELLED.exists(), reason="../shared is not beside the checkout")
def test_the_demo_questions_are_the_shared_files_own() -> None:
    shared = {ex.qas_id: ex for ex in read_squad(SHARED_LABELLED)}
    shipped = read_squad(SHIPPED / "questions.json") + read_squad(SHIPPED / "heldout.json")
    assert shipped
    for ex in shipped:
        original = shared[ex.qas_id]
        assert (original.title, original.question, original.context) == (ex.title, ex.question, ex.context)
        assert original.answers == ex.answers and original.is_impossible == ex.is_impossible
    held_out = read_squad(SHIPPED / "heldout.json")  # every question of its held-out articles
    titles = {ex.title for ex in held_out}
    assert (
        len(held_out)
        == sum(ex.title in titles for ex in shared.values())
        == provenance()["held_out"]["questions"]
    )


def test_the_export_is_small_and_every_file_is_hashed() -> None:
    sidecar = json.loads((SHIPPED / "export.json").read_text())
    assert sidecar["precision"] == "int8"
    hashed = set(sidecar["files_sha256"])
    assert {"model.onnx", "spiece.model"} <= hashed
    size = sum(f.stat().st_size for f in SHIPPED.iterdir())
    assert size < 12 * 2**20, size


def test_the_demo_serves_it_and_gets_the_recorded_answers() -> None:
    text, answers = demo.ask_shipped(SHIPPED)
    recorded = provenance()["demo"]
    questions = read_squad(SHIPPED / "questions.json")
    assert answers == recorded["answers"]  # the bytes shipped give the answers they gave when made
    assert text.count("\nQ: ") == len(questions)
    assert f"{recorded['right']} of {len(questions)} right" in text
    assert "Answerability: " in text and "held out: never trained on" in text


def test_a_tampered_shipped_model_is_refused_not_served(tmp_path: Path) -> None:
    """Someone swaps the shipped weights: the server's hash check stops it before any answer."""
    tampered = tmp_path / "shipped"
    shutil.copytree(SHIPPED, tampered)
    with (tampered / "model.onnx").open("ab") as f:
        f.write(b"x")
    with pytest.raises(RuntimeError, match="exited with 2"):
        demo.ask_shipped(tampered)
