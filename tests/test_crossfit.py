"""`python -m train.crossfit` on a tiny budget: every article is scored by readers, a re-ranker and a rule
that never saw it, and the report carries all three views of every difference."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from paths import REPO

from qa_core.squad import Prediction, SquadExample, read_squad
from qa_core.squad.answerability import from_metadata
from train.common.cli import run
from train.crossfit import main
from train.experiments.pipeline_crossfit import assign_folds, fit_and_report, load_outputs, mixed_articles
from train.experiments.stage_inputs import (
    StageInputsChanged,
    check_stage_inputs,
    content_fingerprint,
    fingerprint,
)

SAMPLE = REPO / "data" / "sample"
TINY = ["--config", "tiny", "--vocab", "1000", "--synth-steps", "2", "--synth-per-sentence", "1"]
TINY += ["--finetune-steps", "3", "--finetune-batch", "2", "--max-seq-len", "96", "--doc-stride", "48"]
TINY += ["--no-progress"]


def labelled_cut(path: Path, paragraphs: int = 2) -> Path:
    """The sample's five labelled articles, each cut to its first paragraphs (a tiny budget)."""
    data = {"version": "v2.0", "data": []}
    for name in ("train", "calibration", "dev"):
        for article in json.loads((SAMPLE / f"{name}.json").read_text())["data"]:
            data["data"].append({**article, "paragraphs": article["paragraphs"][:paragraphs]})
    path.write_text(json.dumps(data))
    return path


def test_folds_are_balanced_deterministic_and_refuse_impossible_counts() -> None:
    data = {
        "data": [
            {"title": t, "paragraphs": [{"qas": [{}] * n}]}
            for t, n in zip("abcde", (9, 7, 5, 3, 1), strict=True)
        ]
    }
    folds = assign_folds(data, 2)
    assert folds == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 0}  # 9 + 3 + 1 = 13 against 7 + 5 = 12
    assert assign_folds(data, 2) == folds
    for bad in (1, 6):
        with pytest.raises(ValueError, match="--folds"):
            assign_folds(data, bad)


def test_mixed_articles_are_those_holding_both_kinds() -> None:
    """The rule's articles: an article of answerable questions only (as SQuAD 2.0's first training
    articles are) is left out, as is one of unanswerable questions only."""
    rows = [("a", True), ("a", False), ("b", True), ("b", True), ("c", False)]
    examples = [
        SquadExample(f"q{i}", t, "q?", "x y", [("x", 0)] if answerable else [], not answerable)
        for i, (t, answerable) in enumerate(rows)
    ]
    assert mixed_articles(examples) == {"a"}


def test_every_article_is_scored_out_of_fold_with_every_view(tmp_path: Path, capsys) -> None:
    out = tmp_path / "crossfit"
    labelled = labelled_cut(tmp_path / "labelled.json")
    args = [*TINY, "--labelled", str(labelled), "--corpus", str(SAMPLE / "corpus.json"), "--folds", "2"]
    assert main([*args, "--final", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    folds = json.loads((out / "folds.json").read_text())
    titles = {ex.title for ex in read_squad(labelled)}
    assert set(folds) == titles and set(folds.values()) == {0, 1}
    for f in (0, 1):  # each reader trained on the other fold's articles only; each fold scored by its own
        trained = {ex.title for ex in read_squad(out / f"fold-{f}" / "train.json")}
        held = {ex.title for ex in read_squad(out / f"fold-{f}" / "heldout.json")}
        assert held == {t for t, g in folds.items() if g == f} and not trained & held
        assert trained | held == titles
        meta = json.loads((out / f"fold-{f}" / "reader" / "metadata.json").read_text())
        assert meta["step"] == 3
    # the reader to ship: every labelled article, and the rule fitted on every fold's out-of-fold outputs
    shipped = out / "final" / "reader"
    assert {ex.title for ex in read_squad(out / "final" / "train.json")} == titles
    meta = json.loads((shipped / "metadata.json").read_text())
    assert meta["step"] == 3 and f"export.onnx --checkpoint {shipped}" in printed
    rule = from_metadata(meta)
    assert rule.reranker is not None  # fitted, with its re-ranker (not the reader's own cls rule)
    fitted = rule.report["fitted_on"]["out_of_fold"]
    assert fitted["folds"] == 2 and fitted["articles"] == len(titles)
    assert fitted["questions"] == len(read_squad(labelled))
    synthetic = {a["title"] for a in json.loads((out / "synthetic.json").read_text())["data"]}
    assert synthetic.isdisjoint(titles)  # the shared stages read no labelled text
    report = json.loads((out / "crossfit.json").read_text())
    assert set(report["per_article"]) == titles and report["articles"] == len(titles)
    assert report["questions"] == len(read_squad(labelled))
    for summary in (report["reranked_vs_reader"], report["decision"]["vs_none"]):  # no view dropped
        assert {"bootstrap", "t_interval", "sign_test_p", "credible"} <= set(summary)
        low, high = summary["bootstrap"]
        assert low <= summary["mean"] <= high
    assert set(report["rules"]) == {"0", "1"} and report["rule_articles"] == "mixed"
    assert set(report["per_fold"]) == {"0", "1"}
    assert sum(f["questions"] for f in report["per_fold"].values()) == report["questions"]
    mixed = report["decision_mixed"]
    assert set(report["mixed_articles"]) <= titles and mixed["articles"] == len(report["mixed_articles"])
    assert {"bootstrap", "t_interval", "sign_test_p"} <= set(mixed["vs_none"])
    page = (out / "RESULTS.md").read_text()
    assert page in printed and "re-ranked vs reader" in page and "sign test" in page
    assert all(f"| {t} |" in page for t in titles)
    assert (out / "crossfit.png").stat().st_size > 5000
    # each reader's spans are decoded once and kept: what is read back is what was decoded
    kept = json.loads((out / "fold-0" / "predictions.json").read_text())
    assert set(kept) == {ex.qas_id for ex in read_squad(out / "fold-0" / "heldout.json")}
    one = next(iter(kept.values()))
    assert Prediction.from_dict(one).to_dict() == one and one["n_best"]
    # a second call reuses every trained stage and reproduces the report byte for byte from them
    first = {name: (out / name).read_bytes() for name in ("RESULTS.md", "crossfit.json")}
    assert main([*args, "--out", str(out)]) == 0
    assert "done in" not in capsys.readouterr().out
    assert {name: (out / name).read_bytes() for name in first} == first
    # kept spans that cannot be read (a kill -9 cannot leave half a file, as they are written whole and
    # renamed; a damaged disk or a hand edit can) or that are older than their reader are decoded again
    (out / "fold-0" / "predictions.json").write_text('{"cut off": {"qas_id": ')
    older = (out / "fold-1" / "reader" / "metadata.json").stat().st_mtime - 60
    os.utime(out / "fold-1" / "predictions.json", (older, older))
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{out / 'fold-0' / 'predictions.json'} cannot be read (JSONDecodeError" in printed
    assert f"{out / 'fold-1' / 'predictions.json'} is older than its reader" in printed
    assert "Traceback" not in printed
    assert {name: (out / name).read_bytes() for name in first} == first
    (out / "fold-0" / "predictions.json").write_text("{}")  # read well, but for other questions
    assert main([*args, "--out", str(out)]) == 0
    assert "fold-0/predictions.json holds other questions" in capsys.readouterr().out
    assert {name: (out / name).read_bytes() for name in first} == first
    kept = json.loads((out / "fold-1" / "predictions.json").read_text())  # as kept before shares were
    for prediction in kept.values():
        for entry in prediction["n_best"]:
            entry.pop("share", None)
    (out / "fold-1" / "predictions.json").write_text(json.dumps(kept))
    assert main([*args, "--out", str(out)]) == 0
    assert "fold-1/predictions.json lacks the spans' shares" in capsys.readouterr().out
    assert {name: (out / name).read_bytes() for name in first} == first
    # stage 3 refitted from the kept spans alone: the same report; then the rule on every article
    examples, readers, fold_of = load_outputs(out)
    fit_and_report(examples, readers, fold_of, tmp_path / "same")
    assert (tmp_path / "same" / "crossfit.json").read_bytes() == first["crossfit.json"]
    refit = fit_and_report(examples, readers, fold_of, tmp_path / "refit", "all")
    assert refit["rule_articles"] == "all" and refit["span_f1"] == report["span_f1"]  # the same spans
    rows = json.loads((tmp_path / "refit" / "questions.json").read_text())
    assert len(rows) == report["questions"]


def test_a_reader_stopped_mid_training_resumes_from_its_checkpoint(tmp_path: Path, capsys) -> None:
    """What a kill -9 after a fold reader's checkpoint at step 4 of 6 leaves (its last checkpoint, no
    finished model): a second call trains that reader on from step 4, reuses every finished stage, and
    ends with the same weights as the run that was never stopped (resuming restores the optimiser, the
    random state and the data position)."""
    out = tmp_path / "crossfit"
    labelled = labelled_cut(tmp_path / "labelled.json")
    args = [*TINY, "--labelled", str(labelled), "--corpus", str(SAMPLE / "corpus.json"), "--folds", "2"]
    args = [*args, "--finetune-steps", "6", "--checkpoint-every", "2", "--out", str(out)]
    assert main(args) == 0
    reader = out / "fold-1" / "reader"
    whole = (reader / "model.safetensors").read_bytes()
    checkpoints = reader / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step-0000006"
    # the state a kill after step 4's checkpoint leaves: step 4 the latest, nothing finished after it
    for name in ("metadata.json", "model.safetensors"):
        (reader / name).unlink()
    for step in checkpoints.glob("step-0000006"):
        for f in step.iterdir():
            f.unlink()
        step.rmdir()
    (checkpoints / "latest").write_text("step-0000004\n")
    (out / "fold-1" / "predictions.json").unlink()  # its spans were never decoded
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Resumed from" in printed and "at step 4" in printed
    assert "[reader 0 (" in printed and "reusing" in printed.split("[reader 0 (")[1].splitlines()[0]
    assert (reader / "model.safetensors").read_bytes() == whole
    assert json.loads((reader / "metadata.json").read_text())["step"] == 6


def test_a_checkpoint_interval_below_one_step_is_refused(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(
            ["--labelled", "x.json", "--corpus", "y.json", "--checkpoint-every", "0", "--out", str(tmp_path)]
        )
    assert stopped.value.code == 2 and "--checkpoint-every must be at least 1" in capsys.readouterr().err


def test_a_reader_to_ship_can_leave_articles_out_to_score_it(tmp_path: Path, capsys) -> None:
    """--final-hold-out: the reader to ship trains on the other articles, its re-ranker and rule are
    fitted on their out-of-fold outputs only, and the held-out articles' questions are kept beside it to
    score the pipeline; its folder is named by the articles, so another hold-out never reuses it."""
    out = tmp_path / "crossfit"
    labelled = labelled_cut(tmp_path / "labelled.json")
    args = [*TINY, "--labelled", str(labelled), "--corpus", str(SAMPLE / "corpus.json"), "--folds", "2"]
    examples = read_squad(labelled)
    titles = sorted({ex.title for ex in examples})
    kept_out = titles[0]
    assert main([*args, "--final", "--final-hold-out", kept_out, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    (folder,) = out.glob("final-holdout-*")
    assert not (out / "final").exists()
    trained = {ex.title for ex in read_squad(folder / "train.json")}
    assert trained == set(titles) - {kept_out}
    assert {ex.title for ex in read_squad(folder / "heldout.json")} == {kept_out}
    meta = json.loads((folder / "reader" / "metadata.json").read_text())
    fitted = from_metadata(meta).report["fitted_on"]["out_of_fold"]
    assert fitted["articles"] == len(titles) - 1
    assert fitted["questions"] == sum(ex.title != kept_out for ex in examples)
    assert kept_out not in fitted["rule_articles"]
    assert str(folder / "heldout.json") in printed
    # another hold-out: another folder (and the folds' stages reused)
    assert main([*args, "--final", "--final-hold-out", titles[1], "--out", str(out)]) == 0
    assert len(list(out.glob("final-holdout-*"))) == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--final-hold-out", "Nowhere"], "give --final too"),
        (["--final", "--final-hold-out", "Nowhere"], "no labelled article is called 'Nowhere'"),
        (["--precision", "fp16"], "--precision fp16 needs a CUDA device"),
    ],
)
def test_a_hold_out_that_cannot_be_made_is_refused_before_any_work(
    tmp_path: Path, capsys, flags: list[str], message: str
) -> None:
    labelled = labelled_cut(tmp_path / "labelled.json")
    out = tmp_path / "crossfit"
    with pytest.raises(SystemExit) as stopped:
        main(
            ["--labelled", str(labelled), "--corpus", str(SAMPLE / "corpus.json"), *flags, "--out", str(out)]
        )
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (out / "tokenizer").exists()  # nothing trained


def test_a_folder_made_from_other_inputs_is_refused_not_reused(tmp_path: Path, capsys) -> None:
    """Every stage records what made it (settings, files by their bytes, earlier stages by their records).
    Called again into the same --out with other labelled articles or other steps, the first stage they
    change stops the call with one line naming what differs, before training it: a fold reader that
    trained on other articles is never taken as out of fold. The same call again reuses everything; work
    made before records were kept is recorded as this call's, and says so."""
    out = tmp_path / "crossfit"
    labelled = labelled_cut(tmp_path / "labelled.json")
    base = [*TINY, "--corpus", str(SAMPLE / "corpus.json"), "--folds", "2", "--out", str(out)]
    assert run(main, [*base, "--labelled", str(labelled)], prog="train.crossfit") == 0
    record = out / "fold-0" / "reader" / "inputs.json"
    kept = {p: p.read_bytes() for p in (record, out / "folds.json", *out.glob("fold-*/*.json"))}
    # the same articles and questions (so the same folds), one paragraph's text edited
    edited = json.loads(labelled.read_text())
    for article in edited["data"]:
        article["paragraphs"][0]["context"] += " An edit."
    other = tmp_path / "other.json"
    other.write_text(json.dumps(edited))
    for flags, stage, differ in (
        (["--labelled", str(other)], "[reader 0 (", "dev_file, train_file differ"),
        (["--labelled", str(labelled), "--finetune-steps", "4"], "[reader 0 (", "steps differ"),
        (["--labelled", str(labelled), "--precision", "bf16"], "[synthetic stage]", "precision differ"),
    ):
        capsys.readouterr()
        assert run(main, [*base, *flags], prog="train.crossfit") == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"train.crossfit: error: {stage}") and differ in err, err
        assert "was made from other inputs" in err and len(err.splitlines()) == 1
        # the record, the reader and the files describing the folds left as they were
        assert all(p.read_bytes() == b for p, b in kept.items())
    # other folds: refused before anything changes, at the folds themselves
    assert run(main, [*base, "--labelled", str(labelled), "--folds", "3"], prog="train.crossfit") == 2
    assert "[folds]" in capsys.readouterr().err
    assert all(p.read_bytes() == b for p, b in kept.items())
    made = kept[record]
    record.unlink()  # as a folder made before records were kept
    assert run(main, [*base, "--labelled", str(labelled)], prog="train.crossfit") == 0
    printed = capsys.readouterr().out
    assert "no record of what made" in printed and record.read_bytes() == made
    assert "[reader 1 (" in printed and "reusing" in printed.split("[reader 1 (")[1].splitlines()[0]


def test_a_record_beside_no_work_is_replaced(tmp_path: Path) -> None:
    """A call stopped after recording a stage's inputs but before it made anything owns nothing: a
    call with other inputs replaces the record instead of refusing; once work is there, it refuses."""
    record = tmp_path / "stage" / "inputs.json"
    check_stage_inputs(record, "stage", {"steps": 3}, made=False)
    check_stage_inputs(record, "stage", {"steps": 4}, made=False)
    assert json.loads(record.read_text()) == {"steps": 4}
    with pytest.raises(
        StageInputsChanged, match=r"\[stage\] .*stage was made from other inputs \(steps differ\)"
    ):
        check_stage_inputs(record, "stage", {"steps": 5}, made=True)
    data = tmp_path / "data.json"
    data.write_bytes(b'{"data": []}')  # a file is recorded by its bytes, as it would be before it is written
    assert fingerprint(str(data)) == content_fingerprint(b'{"data": []}')
