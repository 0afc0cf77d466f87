"""`python -m train.ablation` on a tiny budget: every cell pretrains and fine-tunes, the report and plot are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import SAMPLE_CORPUS, SAMPLE_DEV, SAMPLE_TRAIN
from sample_cuts import small_calibration, small_dev

from train.ablation import main
from train.common.cli import run
from train.experiments.ablation import parse_config


def test_tiny_grid_pretrains_fine_tunes_and_reports(tmp_path):
    out = tmp_path / "abl"
    calibration = small_calibration(tmp_path / "calibration.json")
    dev = small_dev(tmp_path / "dev.json")
    argv = ["--corpus", str(SAMPLE_CORPUS), "--configs", "relu,mish+aoa", "--seeds", "0,1"]
    argv += ["--preset", "tiny", "--vocab", "1000", "--steps", "6", "--batch-size", "2", "--seq-len", "32"]
    argv += [
        "--log-every",
        "2",
        "--train-file",
        str(SAMPLE_TRAIN),
        "--dev-file",
        str(dev),
        "--calibration-file",
        str(calibration),
    ]
    argv += ["--finetune-steps", "2", "--finetune-batch", "2", "--max-seq-len", "64", "--out", str(out)]
    argv += ["--no-progress", "--question-match"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert [(r["config"], r["seed"]) for r in results] == [
        ("relu", 0),
        ("relu", 1),
        ("mish+aoa", 0),
        ("mish+aoa", 1),
    ]
    for r in results:
        assert r["best_loss"] == min(loss for _, loss in r["curve"]) and [s for s, _ in r["curve"]] == [
            2,
            4,
            6,
        ]
        config = json.loads((Path(r["dir"]) / "config.json").read_text())
        assert config["ff_activation"] == parse_config(r["config"])[0]
        assert config["use_aoa"] is r["config"].endswith("+aoa")
        assert 0.0 <= r["dev_f1"] <= 100.0
        low, high = r["dev_f1_minus_none_ci"]
        assert low <= r["dev_f1_minus_none"] <= high
        # the answerability was fitted on articles held out of fine-tuning, never on the scored dev file
        meta = json.loads((Path(r["dir"]) / "finetune" / "metadata.json").read_text())
        assert meta["dev_file"] == str(calibration) != str(dev)
        tuned = json.loads((Path(r["dir"]) / "finetune" / "config.json").read_text())
        assert tuned["question_match"] and not config["question_match"]
    # seeds differ, so the runs of one configuration differ
    assert results[0]["curve"] != results[1]["curve"]
    table = (out / "ablation.md").read_text()
    assert (
        "| relu | 2 |" in table and "| mish+aoa | 2 |" in table and "±" in table and "dev F1 - none" in table
    )
    assert "with the exact-match feature" in table
    assert (out / "ablation.png").stat().st_size > 5000
    # a second call reuses the finished cells
    before = {r["dir"]: (Path(r["dir"]) / "model.safetensors").stat().st_mtime_ns for r in results}
    assert main(argv) == 0
    assert before == {d: (Path(d) / "model.safetensors").stat().st_mtime_ns for d in before}


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--configs", "swish"], "unknown configuration"),
        (["--configs", "gelu+moe"], "unknown configuration"),
        (["--seeds", "a,b"], "--seeds"),
        (["--train-file", str(SAMPLE_TRAIN)], "both --train-file and --dev-file"),
        (["--train-file", str(SAMPLE_TRAIN), "--dev-file", str(SAMPLE_DEV)], "cross-fitted by article"),
        (
            [
                "--train-file",
                str(SAMPLE_TRAIN),
                "--dev-file",
                str(SAMPLE_DEV),
                "--calibration-file",
                str(SAMPLE_DEV),
            ],
            "cross-fitted by article",
        ),
        (["--corpus", "/nonexistent.txt"], "not found"),
    ],
)
def test_bad_arguments_are_clear_errors(extra, message, tmp_path, capsys):
    assert run(main, ["--out", str(tmp_path / "o"), *extra], "train.ablation") == 2
    assert message in capsys.readouterr().err
