"""`python -m train.study` end to end on a tiny budget: every stage runs once, scores are on unseen questions."""

from __future__ import annotations

import json

import pytest
from sample_cuts import small_calibration, small_dev

from qa_core.squad import read_squad
from train.common.cli import run
from train.experiments.stage_inputs import StageInputsChanged
from train.experiments.study import Run, Stages, parse_runs, parse_seeds
from train.study import main

TINY = ["--config", "tiny", "--vocab", "1000", "--pretrain-steps", "4", "--pretrain-batch", "2"]
TINY += ["--seq-len", "32", "--synth-steps", "2", "--finetune-steps", "3", "--finetune-batch", "2"]
TINY += ["--max-seq-len", "96", "--doc-stride", "48", "--eval-every", "3", "--no-progress"]


def test_study_runs_every_stage_and_reports_on_unseen_questions(tmp_path, capsys):
    out = tmp_path / "study"
    tiny = [*TINY, "--calibration-file", str(small_calibration(tmp_path / "calibration-small.json"))]
    tiny += ["--eval-file", str(small_dev(tmp_path / "dev-small.json"))]
    assert main([*tiny, "--runs", "pretrained+synth,random+match", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for stage in (
        "pretrain",
        "synthetic stage (synth-stage-pretrained)",
        "fine-tune (pretrained+synth)",
        "fine-tune (random+match)",
    ):
        assert f"[{stage}] done in" in printed
    fit, thr, held = (read_squad(out / f) for f in ("fit.json", "calibration.json", "eval.json"))
    titles = [{ex.title for ex in part} for part in (fit, thr, held)]
    assert not (titles[0] & titles[1]) and not (titles[0] & titles[2]) and not (titles[1] & titles[2])
    synthetic = json.loads((out / "synthetic.json").read_text())
    assert {a["title"] for a in synthetic["data"]}.isdisjoint(titles[2])  # no eval text in training data
    meta = json.loads((out / "finetune-pretrained-synth" / "metadata.json").read_text())
    assert meta["threshold_selected_on"] == str(out / "calibration.json") and meta["step"] == 3
    assert json.loads((out / "synth-stage-pretrained" / "metadata.json").read_text())["init"] == str(
        out / "pretrain"
    )
    report = (out / "RESULTS.md").read_text()
    assert "| no-answer baseline |" in report and "| tiny, pretrained+synth |" in report
    assert "| tiny, random+match |" in report and "articles held out of fine-tuning" in report
    configs = {
        d: json.loads((out / d / "config.json").read_text()) for d in ("finetune-random-match", "pretrain")
    }
    assert configs["finetune-random-match"]["question_match"] and not configs["pretrain"]["question_match"]
    assert not json.loads((out / "finetune-pretrained-synth" / "config.json").read_text())["question_match"]
    assert (out / "study.png").stat().st_size > 5000
    # intervals resample whole articles (and, beside them, paragraphs); each article's gain is kept
    evaluated = {ex.title for ex in held}
    assert "articles were scored: an interval that resamples so few articles is indicative" in report
    for rows in json.loads((out / "comparison.json").read_text()).values():
        for row in rows["rows"]:
            assert row["low"] <= row["diff"] <= row["high"]
            assert row["paragraph_low"] <= row["diff"] <= row["paragraph_high"]
            assert set(row["per_article"]) == evaluated
    # a second call reuses every stage
    assert main([*tiny, "--runs", "pretrained+synth,random+match", "--out", str(out)]) == 0
    assert "done in" not in capsys.readouterr().out
    # one with other steps stops at the first stage they change, before training it
    other = [*tiny, "--finetune-steps", "4", "--runs", "random+match", "--out", str(out)]
    with pytest.raises(StageInputsChanged, match=r"\[fine-tune \(random\+match\)\] .* \(steps differ\)"):
        main(other)
    assert json.loads((out / "finetune-random-match" / "metadata.json").read_text())["step"] == 3
    # other articles to score: refused before the split files that describe the stages change
    edited = json.loads((out / "eval.json").read_text())
    edited["data"][0]["paragraphs"][0]["context"] += " An edit."
    (tmp_path / "dev-edited.json").write_text(json.dumps(edited))
    splits = {name: (out / name).read_bytes() for name in ("fit.json", "calibration.json", "eval.json")}
    retold = [*tiny[:-2], "--eval-file", str(tmp_path / "dev-edited.json")]  # tiny ends with --eval-file
    with pytest.raises(StageInputsChanged, match=r"\[splits\] .*eval.json differ"):
        main([*retold, "--runs", "random+match", "--out", str(out)])
    assert {name: (out / name).read_bytes() for name in splits} == splits


def test_run_names():
    runs = parse_runs("random, pretrained+synth+match,random+match")
    assert [r.name for r in runs] == ["random", "pretrained+synth+match", "random+match"]
    assert parse_runs("random+match+synth") == [Run("random", synth=True, match=True)]
    assert runs[1].slug == "pretrained-synth-match"


def test_seeds() -> None:
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    for bad in ("", "1,1", "a"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def test_bad_study_arguments(tmp_path, capsys):
    for bad in ("pretrained+magic", "random+synth+synth", "synth"):
        assert run(main, ["--runs", bad, "--out", str(tmp_path)], "study") == 2
        assert "unknown run" in capsys.readouterr().err
    assert run(main, ["--threshold-articles", "5", "--out", str(tmp_path)], "study") == 2
    assert "leaves no article" in capsys.readouterr().err
    assert run(main, ["--train-file", str(tmp_path / "nope.json"), "--out", str(tmp_path)], "study") == 2
    assert "not found" in capsys.readouterr().err


def test_scored_articles_by_title_and_never_the_samples_calibration(tmp_path, sample_dir) -> None:
    from qa_core.squad import load_dataset, write_squad
    from train.experiments.study import build_parser, prepare_data

    labelled = {"version": "v2.0", "data": []}
    for name in ("train", "calibration", "dev"):
        labelled["data"] += load_dataset(sample_dir / f"{name}.json")["data"]
    write_squad(labelled, tmp_path / "labelled.json")
    base = ["--labelled", str(tmp_path / "labelled.json"), "--out", str(tmp_path / "o")]
    args = build_parser().parse_args(
        [*base, "--eval-articles", "1973_oil_crisis", "--calibration-articles", "Normans,Harvard_University"]
    )
    fit, calibration, held, honest = prepare_data(args, tmp_path)
    titles = [{ex.title for ex in read_squad(p)} for p in (fit, calibration, held)]
    assert titles == [
        {"Yuan_dynasty", "Computational_complexity_theory"},
        {"Normans", "Harvard_University"},
        {"1973_oil_crisis"},
    ]
    assert honest
    for bad, message in (
        ("Yuan_dynasty", "sample's calibration articles"),
        ("Atlantis", "unknown article titles"),
    ):
        with pytest.raises(ValueError, match=message):
            prepare_data(build_parser().parse_args([*base, "--eval-articles", bad]), tmp_path)


def test_a_stage_that_returns_unfinished_stops_the_pipeline(tmp_path, capsys) -> None:
    """A training stage asked to stop (SIGTERM) saves a checkpoint and returns without its final files:
    the pipeline stops there as interrupted (exit 130 through the command's runner) instead of going on
    to a stage that would read a model that is not there."""
    stages = Stages()
    done = tmp_path / "stage" / "metadata.json"
    with pytest.raises(KeyboardInterrupt):
        stages.run("reader 1", done, lambda: (tmp_path / "stage" / "checkpoints").mkdir(parents=True))
    printed = capsys.readouterr().out
    assert "[reader 1] stopped before it finished (metadata.json not written)" in printed
    assert "done in" not in printed

    def pipeline(argv) -> int:
        stages.run("reader 1", done, lambda: None)
        return 0

    assert run(pipeline, [], prog="train.crossfit") == 130
    assert "train.crossfit: interrupted" in capsys.readouterr().err
