"""Run directories: a fresh run never mixes with another run's checkpoints, ``--resume`` alone continues
a run with its recorded settings, contradicting flags are refused naming the difference, and what an
interrupted save left behind is cleaned up. Real pretraining runs of the tiny preset."""

from __future__ import annotations

import json

import pytest
from fixtures_spm import TINY_PRETRAIN_ARGS as RESUME_ARGS
from paths import REPO, SAMPLE

from train.common.cli import run
from train.engine.run_record import RUN_FILE, explicit_flags
from train.engine.state import latest_checkpoint
from train.finetune import main as finetune_main
from train.model import checkpoint
from train.pretrain import main as pretrain_main


def pretrain(argv: list[str], capsys) -> tuple[int, str]:
    code = run(pretrain_main, argv, prog="train.pretrain")
    return code, capsys.readouterr().err


def test_a_fresh_run_refuses_a_directory_holding_another_run(spm_dir, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    common = [*RESUME_ARGS, "--spm", str(spm_dir), "--out", str(out)]
    assert pretrain([*common, "--stop-after", "2"], capsys)[0] == 0
    first = json.loads((out / RUN_FILE).read_text())
    old_latest = latest_checkpoint(out)

    code, err = pretrain([*common, "--seed", "5"], capsys)
    assert code == 2 and "holds a pretrain run started" in err and "--resume" in err and "--overwrite" in err
    assert latest_checkpoint(out) == old_latest and json.loads((out / RUN_FILE).read_text()) == first

    sample = SAMPLE
    finetune_argv = [
        "--train-file",
        str(sample / "train.json"),
        "--dev-file",
        str(sample / "dev.json"),
        "--out",
        str(out),
    ]
    assert run(finetune_main, finetune_argv, prog="train.finetune") == 2  # another command's run
    assert "holds a pretrain run" in capsys.readouterr().err

    assert pretrain([*common, "--seed", "5", "--stop-after", "1", "--overwrite"], capsys)[0] == 0
    second = json.loads((out / RUN_FILE).read_text())
    assert second["run_id"] != first["run_id"] and second["settings"]["seed"] == 5
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == [
        "step-0000001"
    ]  # the old run's are gone


def test_resume_alone_continues_with_the_recorded_settings(spm_dir, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = [*RESUME_ARGS, "--spm", str(spm_dir), "--out", str(out), "--stop-after", "3"]
    assert pretrain(argv, capsys)[0] == 0
    # What a kill -9 during a save leaves behind: a temporary step directory and a staging directory.
    (out / "checkpoints" / ".step-0000004.tmp-x1").mkdir()
    (out / ".model-staging").mkdir()

    code, err = pretrain(["--out", str(out), "--resume", "--seq-len", "64", "--lr", "0.5"], capsys)
    assert code == 2 and "--seq-len 64 (recorded 32)" in err and "--lr 0.5 (recorded 0.001)" in err

    assert pretrain(["--out", str(out), "--resume", "--no-progress"], capsys)[0] == 0
    assert not (out / "tokenizer").exists()  # the recorded --spm was used, no new tokenizer trained
    assert (
        not (out / "checkpoints" / ".step-0000004.tmp-x1").exists() and not (out / ".model-staging").exists()
    )
    assert latest_checkpoint(out).name == "step-0000008"
    loaded = checkpoint.load(out)
    assert loaded.model.config.n_layer == 2 and loaded.metadata["args"]["seq_len"] == 32
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(s for s in steps) == list(range(1, 9))


def test_a_run_refused_for_its_inputs_records_nothing(spm_dir, tmp_path, capsys) -> None:
    """A missing corpus is found before the run is recorded, so fixing the flag and running again works."""
    out = tmp_path / "run"
    code, err = pretrain(
        [*RESUME_ARGS, "--spm", str(spm_dir), "--out", str(out), "--corpus", "nope.txt"], capsys
    )
    assert code == 2 and "corpus file not found: nope.txt" in err
    assert not (out / RUN_FILE).exists()


def test_explicit_flags_are_those_on_the_command_line_whatever_their_value() -> None:
    from train.pretrain import build_parser

    parser = build_parser()
    given = explicit_flags(parser, ["--out", "x", "--seq-len", "128", "--resume"])
    assert given == {"out", "seq_len", "resume"}  # --seq-len 128 is the default, and still given
    assert parser.parse_args(["--out", "x"]).seq_len == 128  # the parser's defaults are intact


@pytest.mark.parametrize("keep_last", [1, 2])
def test_pruning_keeps_the_newest_and_never_what_latest_names(spm_dir, tmp_path, capsys, keep_last) -> None:
    out = tmp_path / "run"
    argv = [*RESUME_ARGS, "--spm", str(spm_dir), "--out", str(out), "--save-every", "1"]
    assert pretrain([*argv, "--keep-last", str(keep_last), "--stop-after", "5"], capsys)[0] == 0
    kept = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert kept == [f"step-{s:07d}" for s in range(6 - keep_last, 6)]
    assert latest_checkpoint(out).name == "step-0000005"


class Crash(Exception):
    """Stands for a kill -9 at one filesystem operation of a save."""


def crash_at(monkeypatch, name: str, n: int) -> None:
    """Make the ``n``-th call of ``os.<name>`` from now on raise Crash (the save stops right there)."""
    import os

    real = getattr(os, name)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise Crash(f"{name} #{n}")
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, failing)


def tiny_model(seed: int):
    import torch

    from train.model import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(seed)
    return XLNetLMHeadModel(XLNetConfig.preset("tiny", vocab_size=120, dropout=0.0))


def same_weights(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("operation", ["replace", "fsync"])
def test_a_crash_at_any_point_of_a_save_leaves_one_whole_checkpoint(tmp_path, monkeypatch, operation) -> None:
    """Crash a step save and a final-model save at each of their renames/fsyncs in turn: afterwards
    `latest` and the run directory hold exactly the old or exactly the new weights (every tensor)."""
    import torch

    from train.engine.optim import make_optimizer
    from train.engine.run_record import start_run
    from train.engine.state import save_training_state

    old, new = tiny_model(0), tiny_model(1)
    crashed_in_final_save = 0
    for n in range(1, 200):  # every crash point in turn, until the saves get through whole
        out = tmp_path / f"{operation}-{n}"
        optimizer = make_optimizer(old, lr=1e-3)
        save_training_state(out, 1, old, optimizer, None, metadata={"v": "old"})
        checkpoint.save_into(old, out, metadata={"v": "old"})
        completed = step_saved = False
        with monkeypatch.context() as m:
            crash_at(m, operation, n)
            try:
                save_training_state(out, 2, new, optimizer, None, metadata={"v": "new"})
                step_saved = True
                checkpoint.save_into(new, out, metadata={"v": "new"})
                completed = True
            except Crash:
                crashed_in_final_save += step_saved
        ns = type("Args", (), {"overwrite": False, "resume": True})()
        start_run(out, "pretrain", ns)  # what the next --resume does first: finish or clean up
        step = checkpoint.load(latest_checkpoint(out))
        assert same_weights(step.model, old if step.metadata["v"] == "old" else new)
        final = checkpoint.load(out)
        assert same_weights(final.model, old if final.metadata["v"] == "old" else new)
        assert not [p for p in out.rglob(".*") if p.name != "checkpoints"], list(out.rglob(".*"))
        assert all(torch.isfinite(p).all() for p in final.model.parameters())
        if completed:
            assert step.metadata["v"] == final.metadata["v"] == "new"
            break
    assert completed and n > 5 and crashed_in_final_save >= 3, (n, crashed_in_final_save)


def test_a_save_that_cannot_be_written_fails_clearly_and_keeps_the_last_checkpoint(spm_dir, tmp_path) -> None:
    """A file-size limit (as a full disk would) stops the resumed run at its first save: exit 1 with one
    line, `latest` still names the earlier checkpoint, which loads; no temporary directory is left."""
    import resource
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = [*RESUME_ARGS, "--spm", str(spm_dir), "--out", str(out), "--save-every", "2"]
    assert run(pretrain_main, [*argv, "--stop-after", "2"]) == 0
    before = latest_checkpoint(out)
    weights = (before / "model.safetensors").stat().st_size

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (weights // 2, weights // 2))

    proc = subprocess.run(
        [sys.executable, "-m", "train.pretrain", "--out", str(out), "--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert "could not write checkpoint" in message and "File too large" in message and "intact" in message
    assert "Traceback" not in proc.stderr
    assert latest_checkpoint(out) == before
    state = json.loads((before / "trainer.json").read_text())
    assert state["step"] == 2 and checkpoint.load(before).model.config.n_layer == 2
    assert not [p for p in out.rglob(".*") if p.name != "checkpoints"]


def test_finetune_resume_alone_and_overwrite_replaces_everything(spm_dir, tmp_path, capsys) -> None:
    """Fine-tuning: `--out R --resume` alone continues (the data files come from the record), and
    `--overwrite` removes all the old run wrote (a tokenizer it trained, its metrics, its model)."""
    sample = SAMPLE
    out = tmp_path / "ft"
    argv = ["--train-file", str(sample / "train.json"), "--dev-file", str(sample / "dev.json")]
    argv += ["--config", "tiny", "--train-spm", "400", "--steps", "4", "--eval-every", "4", "--no-progress"]
    argv += ["--max-seq-len", "96", "--doc-stride", "48", "--max-query-len", "24", "--batch-size", "4"]
    assert run(finetune_main, [*argv, "--out", str(out), "--stop-after", "2"]) == 0
    assert run(finetune_main, ["--out", str(out), "--resume", "--no-progress"]) == 0
    assert latest_checkpoint(out).name == "step-0000004" and checkpoint.load(out).kind == "qa:shallow"
    assert (out / "tokenizer" / "spiece.model").exists()

    code = run(finetune_main, ["--out", str(out / "new"), "--resume"])  # nothing recorded there
    assert code == 2 and "--train-file is required" in capsys.readouterr().err
    assert not (out / "new" / RUN_FILE).exists()  # refused before anything was recorded

    assert (
        run(
            finetune_main,
            [*argv, "--train-spm", "300", "--out", str(out), "--overwrite", "--stop-after", "1"],
        )
        == 0
    )
    assert checkpoint.load(latest_checkpoint(out)).tokenizer.vocab_size == 300  # a new tokenizer, not the old
    assert not (out / "config.json").exists() and not (out / "dev_predictions").exists()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(s <= 1 for s in steps)  # the old run's records (up to step 4) are gone


def test_recipe_values_are_not_mistaken_for_given_flags() -> None:
    from train.finetune import build_parser, parse_args

    args = parse_args(["--recipe", "xlnet-squad-base", "--out", "x", "--resume"])
    assert args.explicit_flags == {"recipe", "out", "resume"}
    assert build_parser().parse_args(["--out", "x"]).recipe is None


def test_an_interrupted_directory_swap_is_put_back(tmp_path) -> None:
    """killed between `target -> .target.old-PID` and `tmp -> target`: the old directory returns."""
    from train.engine.run_record import clean_temporaries

    (tmp_path / ".best.old-123").mkdir()
    (tmp_path / ".best.old-123" / "model.safetensors").write_text("old")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / ".step-0000002.tmp-abc").mkdir()
    (tmp_path / "checkpoints" / "step-0000001").mkdir()
    (tmp_path / "checkpoints" / ".step-0000001.old-9").mkdir()  # its replacement is in place
    clean_temporaries(tmp_path)
    assert (tmp_path / "best" / "model.safetensors").read_text() == "old"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-0000001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "checkpoints"]
