"""Pretraining: one step equals the HF oracle, learning beats the unigram baseline, kill-and-resume."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from fixtures_spm import TINY_PRETRAIN_ARGS as RESUME_ARGS
from module_runs import run_module
from paths import REPO, SAMPLE_CORPUS, SHARED_TEST_NAME, shared_squad_file
from xlnet_oracle import hf_loss

from harness.server_process import free_port
from train.data import PretrainBatches, PretrainDataConfig
from train.engine.execution import to_tensors
from train.engine.state import latest_checkpoint
from train.model import XLNetConfig, XLNetLMHeadModel, checkpoint
from train.pretrain import main as pretrain_main
from train.recipes.pretrain import pretrain_loss

SHARED_CORPUS = shared_squad_file(SHARED_TEST_NAME)


def small_batches(tok, bi_data=False, seed=0):
    cfg = PretrainDataConfig(
        seq_len=32, reuse_len=16, batch_size=2, bi_data=bi_data, seed=seed, num_predict=5
    )
    return PretrainBatches.from_files([SAMPLE_CORPUS], tok, cfg)


@pytest.mark.parametrize("bi_data", [False, True])
def test_one_step_equals_hf_oracle(xlnet_tok, bi_data, tmp_path):
    """Loss and every gradient of one step (with memory from the previous batch) match HF's model."""
    torch.manual_seed(0)
    config = XLNetConfig.preset(
        "tiny", vocab_size=xlnet_tok.vocab_size, dropout=0.0, mem_len=24, reuse_len=16, bi_data=bi_data
    )
    ours = XLNetLMHeadModel(config)
    checkpoint.save(ours, tmp_path / "m")
    hf = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "m")
    hf.train()
    ours.train()
    data = small_batches(xlnet_tok, bi_data=bi_data)
    first, second = (to_tensors(next(data), torch.device("cpu")) for _ in range(2))

    _, mems = pretrain_loss(ours, first)
    loss, _ = pretrain_loss(ours, second, mems)
    loss.backward()

    _, hf_mems = hf_loss(hf, first)
    ref_loss, _ = hf_loss(hf, second, hf_mems)
    ref_loss.backward()

    assert abs(loss.item() - ref_loss.item()) <= 1e-5
    hf_params = dict(hf.named_parameters())
    worst = 0.0
    for name, p in ours.named_parameters():
        ref = hf_params[name].grad
        assert p.grad is not None and ref is not None, name
        worst = max(worst, (p.grad - ref).abs().max().item())
    print(f"loss {loss.item():.6f} vs HF {ref_loss.item():.6f}; max |grad diff| {worst:.2e}")
    assert worst <= 1e-5


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_tiny_pretraining_beats_unigram_baseline(tmp_path):
    """On the shared corpus (sample if absent) the loss falls clearly below the unigram entropy.

    Single-token targets (--max-gram 1) so that a 0.2M-parameter model shows context use within the
    test's budget; whole 5-token spans need far more steps before context beats the unigram prior.
    """
    corpus = SHARED_CORPUS or SAMPLE_CORPUS
    out = tmp_path / "run"
    args = [
        "--corpus",
        str(corpus),
        "--config",
        "tiny",
        "--train-spm",
        "1000",
        "--steps",
        "500",
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--seq-len",
        "64",
        "--reuse-len",
        "32",
        "--mem-len",
        "32",
        "--lr",
        "3e-3",
        "--warmup",
        "20",
        "--log-every",
        "50",
        "--save-every",
        "1000",
        "--no-progress",
        "--dropout",
        "0.0",
        "--max-gram",
        "1",
    ]
    assert pretrain_main(args) == 0
    records = read_metrics(out)
    baseline = records[-1]["unigram_baseline"]
    final = records[-1]["loss"]  # mean over the last 50 steps
    print(
        f"unigram-entropy baseline {baseline:.3f} nats/token, final loss (mean of last 50 steps) {final:.3f}"
    )
    assert final < baseline - 0.3
    loaded = checkpoint.load(out)
    assert loaded.kind == "lm" and loaded.tokenizer is not None
    assert (out / "loss.png").stat().st_size > 5000


def test_kill_and_resume_reaches_the_same_loss(spm_dir, tmp_path, capsys):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = [*RESUME_ARGS, "--spm", str(spm_dir)]
    assert pretrain_main([*common, "--out", str(straight)]) == 0
    capsys.readouterr()
    assert pretrain_main([*common, "--out", str(resumed), "--stop-after", "3"]) == 0
    said = capsys.readouterr().out  # a stopped run says where it stands and how to go on
    assert f"Stopped at step 3 of 8; its checkpoint is in {resumed / 'checkpoints'}" in said, said[-2000:]
    assert f"python -m train.pretrain ... --out {resumed} --resume" in said
    assert latest_checkpoint(resumed).name == "step-0000003"
    assert pretrain_main([*common, "--out", str(resumed), "--resume"]) == 0
    a = {r["step"]: r["loss"] for r in read_metrics(straight)}
    b = {r["step"]: r["loss"] for r in read_metrics(resumed)}
    assert sorted(b) == list(range(1, 9))  # no duplicated or lost steps in the resumed log
    for step in range(4, 9):
        assert abs(a[step] - b[step]) <= 1e-5, (step, a[step], b[step])
    sd_a = checkpoint.load(straight).model.state_dict()
    sd_b = checkpoint.load(resumed).model.state_dict()
    assert max((sd_a[k] - sd_b[k]).abs().max().item() for k in sd_a) <= 1e-5


def test_kill_9_on_prepared_data_then_resume_continues_at_the_same_token(spm_dir, tmp_path):
    """kill -9 a --data run after a checkpoint; --resume gives every later step the loss of an
    uninterrupted run (the same batches: the data position in the checkpoint is exact)."""
    from train.prepare_corpus import main as prepare_main

    data = tmp_path / "data"
    assert prepare_main(["--corpus", str(SAMPLE_CORPUS), "--spm", str(spm_dir), "--out", str(data)]) == 0
    at = RESUME_ARGS.index("--corpus")
    common = [*RESUME_ARGS[:at], *RESUME_ARGS[at + 2 :], "--data", str(data), "--save-every", "1"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert pretrain_main([*common, "--out", str(straight)]) == 0
    cmd = [sys.executable, "-m", "train.pretrain", *common, "--out", str(killed)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        latest = latest_checkpoint(killed)
        if latest is not None and int(latest.name.split("-")[1]) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stopped = int(latest_checkpoint(killed).name.split("-")[1])
    assert 3 <= stopped < 8, stopped
    assert pretrain_main([*common, "--out", str(killed), "--resume"]) == 0
    a = {r["step"]: r["loss"] for r in read_metrics(straight)}
    b = {r["step"]: r["loss"] for r in read_metrics(killed)}
    for step in range(stopped + 1, 9):
        assert abs(a[step] - b[step]) <= 1e-5, (step, a[step], b[step])


def saving_after(checkpoints: Path, step: int) -> bool:
    """Is a save of a step after ``step`` under way (its temporary directory exists)?"""
    try:
        names = os.listdir(checkpoints)
    except FileNotFoundError:
        return False
    return any(n.startswith(".step-") and ".tmp-" in n and int(n[6:13]) > step for n in names)


def test_sigkill_during_saves_always_leaves_the_exact_checkpoint_of_its_step(spm_dir, tmp_path):
    """kill -9 a run that saves every step, many times, each time at once or 0-30 ms after a save began
    (its temporary directory appeared): `latest` always loads and equals, tensor by tensor, an
    uninterrupted run's checkpoint of the same step; some kills provably interrupted a save (its
    temporary directory was left, and the next start removed it); the finished run equals the
    uninterrupted one."""
    import random

    common = [*RESUME_ARGS, "--spm", str(spm_dir), "--save-every", "1", "--steps", "40"]
    reference = tmp_path / "reference"
    assert pretrain_main([*common, "--out", str(reference), "--keep-last", "100"]) == 0
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "train.pretrain", *common, "--out", str(out), "--keep-last", "2", "--resume"]
    rng = random.Random(0)
    interrupted, kills, seen = 0, 0, 0
    while kills < 12 and interrupted < 3:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:  # wait for a save of a new step to begin
            if saving_after(out / "checkpoints", seen):
                break
            time.sleep(0.001)
        if proc.poll() is not None:
            break  # finished before this kill: nothing left to interrupt
        # every other kill at once (inside the save unless it just ended: saves of this tiny model take
        # milliseconds), the others somewhere in the next 30 ms (inside or just after it)
        time.sleep(0.0 if kills % 2 == 0 else rng.uniform(0.0, 0.03))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if any(p.name.startswith(".") and ".tmp-" in p.name for p in (out / "checkpoints").iterdir()):
            interrupted += 1
        latest = latest_checkpoint(out)
        if latest is None:  # the kill landed inside the run's first save: nothing complete to compare yet
            continue
        seen = int(latest.name.split("-")[1])
        assert json.loads((latest / "trainer.json").read_text())["step"] == seen
        got = checkpoint.load(latest).model.state_dict()
        want = checkpoint.load(reference / "checkpoints" / latest.name).model.state_dict()
        assert got.keys() == want.keys()
        assert max((got[k] - want[k]).abs().max().item() for k in got) <= 1e-5, latest.name
    assert interrupted >= 1, f"none of {kills} kills landed inside a save"
    assert subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=300).returncode == 0
    assert not [p for p in out.rglob(".*") if ".tmp-" in p.name]  # cleaned at the next start
    final, want = checkpoint.load(out).model.state_dict(), checkpoint.load(reference).model.state_dict()
    assert max((final[k] - want[k]).abs().max().item() for k in final) <= 1e-5


def test_ctrl_c_saves_and_exits_cleanly(spm_dir, tmp_path):
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "train.pretrain",
        *RESUME_ARGS,
        "--spm",
        str(spm_dir),
        "--out",
        str(out),
        "--steps",
        "100000",
        "--save-every",
        "100000",
    ]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert "Stop requested" in output and "Traceback" not in output
    assert latest_checkpoint(out) is not None


def test_torchrun_two_processes_on_cpu(spm_dir, tmp_path):
    out = tmp_path / "ddp"
    cmd = [*torchrun_pretrain(spm_dir, out), "--steps", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "world 2" in proc.stdout
    assert checkpoint.load(out).kind == "lm"
    assert [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step-")] == ["step-0000004"]
    assert len(read_metrics(out)) == 4  # only rank 0 writes


def test_torchrun_two_ranks_on_a_prepared_corpus(spm_dir, tmp_path):
    """The ranks memory-map one prepared directory (nothing tokenized at start) and train together."""
    from train.prepare_corpus import main as prepare_main

    data = tmp_path / "data"
    assert prepare_main(["--corpus", str(SAMPLE_CORPUS), "--spm", str(spm_dir), "--out", str(data)]) == 0
    out = tmp_path / "ddp"
    base = torchrun_pretrain(spm_dir, out)
    at = base.index("--corpus")  # the tiny arguments name the sample; --data replaces it
    cmd = [*base[:at], *base[at + 2 :], "--data", str(data), "--steps", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "world 2" in proc.stdout and "tokenizing" not in proc.stdout + proc.stderr
    assert not (out / "data").exists() and len(read_metrics(out)) == 3


def torchrun_pretrain(spm_dir: Path, out: Path) -> list[str]:
    """A 2-rank gloo pretraining of the tiny preset into ``out``, on a free port (add flags to it)."""
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    head += ["--master_port", str(free_port()), "-m", "train.pretrain", *RESUME_ARGS]
    return [*head, "--spm", str(spm_dir), "--out", str(out), "--device", "cpu"]


def worker_pids(parent: int) -> dict[int, int]:
    """{rank: pid} of torchrun's worker processes (read from their environment)."""
    out = {}
    for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        rank = [e for e in env if e.startswith(b"RANK=")]
        if rank:
            out[int(rank[0][5:])] = int(child)
    return out


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(spm_dir, tmp_path):
    """A scheduler's SIGTERM reaches rank 1 only: all ranks agree to stop, save together and exit 0."""
    out = tmp_path / "ddp"
    cmd = [*torchrun_pretrain(spm_dir, out), "--steps", "100000", "--save-every", "100000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        deadline = time.time() + 180
        while not ((out / "metrics.jsonl").exists() and len(read_metrics(out)) >= 3):
            assert time.time() < deadline and proc.poll() is None, "the two-rank run did not start"
            time.sleep(0.1)
        os.kill(worker_pids(proc.pid)[1], signal.SIGTERM)
        output, _ = proc.communicate(timeout=90)  # a collective mismatch would hang here
    finally:
        if proc.poll() is None:  # a hang: take the workers down too (killing torchrun alone orphans them)
            for pid in worker_pids(proc.pid).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    latest = latest_checkpoint(out)
    assert latest is not None and int(latest.name.split("-")[1]) >= 3
    state = json.loads((latest / "trainer.json").read_text())
    assert len(state["data"]) == 2  # both ranks' data positions were gathered at the same step


def test_cli_help_and_bad_input(tmp_path):
    help_text = subprocess.run(
        [sys.executable, "-m", "train.pretrain", "--help"], cwd=REPO, capture_output=True, text=True
    ).stdout
    for flag in (
        "--corpus",
        "--spm",
        "--train-spm",
        "--resume",
        "--seq-len",
        "--reuse-len",
        "--mem-len",
        "--perm-size",
        "--num-predict",
        "--mask-alpha",
        "--mask-beta",
        "--bi-data",
        "--batch-size",
        "--lr",
        "--warmup",
        "--seed",
        "--aoa",
        "--activation",
        "--precision",
        "--grad-accum",
    ):
        assert flag in help_text
    bad = run_module("train.pretrain", "--corpus", tmp_path / "nope.txt", "--out", tmp_path / "o")
    assert bad.returncode == 2
    assert "not found" in bad.stderr and "Traceback" not in bad.stderr


def test_a_failed_save_on_rank_0_brings_every_rank_down_promptly(spm_dir, tmp_path):
    """Rank 0 cannot write its checkpoint (a file-size limit, as a full disk): it exits with the clear
    error and torchrun takes rank 1 down too, instead of rank 1 waiting in a collective for its timeout."""
    import resource

    out = tmp_path / "ddp"
    cmd = [*torchrun_pretrain(spm_dir, out), "--save-every", "2"]

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))  # below the weights file

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.time()
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=env, preexec_fn=limit_file_size
    )
    assert proc.returncode != 0
    assert "could not write checkpoint" in proc.stdout + proc.stderr
    assert time.time() - start < 90
    assert latest_checkpoint(out) is None  # nothing half-written became `latest`
    assert not [p for p in out.rglob(".*") if ".tmp-" in p.name]
