"""Every documented ``python -m`` command still starts: ``--help`` exits 0 and prints a usage line.

The commands are the project's promised names, every ``python -m`` of this repository's packages that
README.md, BENCHMARKS.md, the Makefile or docs/ shows, and every bench module with a main; each runs
in a real interpreter from the repository root, as a user would type it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from paths import REPO

# The names the README promises; the documents may show more (found below), never fewer.
PROMISED = [
    "train.pretrain",
    "train.finetune",
    "train.evaluate",
    "train.calibrate",
    "train.prepare_corpus",
    "train.study",
    "train.rerank_report",
    "train.ablation",
    "train.sweep",
    "train.synth",
    "train.tokenizer",
    "export.onnx",
    "export.trt",
    "export.triton",
    "export.stack_report",
    "export.gpu_versions",
    "server",
]
DOCUMENTS = [
    "README.md",
    "BENCHMARKS.md",
    "Makefile",
    *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")),
]
# `python -m x`, and the Makefile's `$(PY) -m x` (any variable naming an interpreter)
COMMAND = re.compile(r"(?:\bpython3?|\$\([A-Z_]*PY[A-Z_]*\)) -m ([A-Za-z_][\w.]*)")


def documented_commands() -> set[str]:
    """The ``python -m`` modules of this repository (not pip, venv, pytest) that the documents show."""
    found = set()
    for name in DOCUMENTS:
        found.update(COMMAND.findall((REPO / name).read_text(encoding="utf-8")))
    return {m.rstrip(".") for m in found if (REPO / m.split(".")[0]).is_dir()}


def bench_commands() -> set[str]:
    return {
        f"bench.{p.stem}"
        for p in (REPO / "bench").glob("*.py")
        if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")
    }


COMMANDS = sorted(set(PROMISED) | documented_commands() | bench_commands())


def test_the_list_is_found() -> None:
    """The documents are read (a renamed file would otherwise shrink the list silently)."""
    assert all((REPO / name).is_file() for name in DOCUMENTS)
    assert {"train.finetune", "export.onnx", "server", "bench.latency"} <= documented_commands()
    assert {"bench.latency", "bench.serve", "bench.train"} <= bench_commands()


@pytest.mark.parametrize("module", COMMANDS)
def test_help_exits_zero_with_a_usage_line(module: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"^usage: ", r.stdout, re.M), r.stdout[:500]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"python -m {module} " in r.stdout.splitlines()[0] or module == "server", r.stdout.splitlines()[0]


@pytest.mark.parametrize("name", ["study", "ablation", "sweep", "synth"])
def test_an_experiment_command_reports_a_user_error_in_one_line(name: str, tmp_path) -> None:
    """`python -m train.NAME`, the experiment's one name, turns a user error into one line under that
    name and exit code 2, never a traceback."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    flags = {
        "synth": ["--input", str(tmp_path / "absent.txt"), "--out", str(tmp_path / "q.json")],
        "study": ["--train-file", str(tmp_path / "absent.json"), "--out", str(tmp_path / "run")],
        "ablation": ["--corpus", str(tmp_path / "absent.txt"), "--out", str(tmp_path / "run")],
        "sweep": [
            "--train-file",
            str(tmp_path / "absent.json"),
            "--dev-file",
            str(tmp_path / "d.json"),
            "--out",
            str(tmp_path / "run"),
        ],
    }[name]
    r = subprocess.run(
        [sys.executable, "-m", f"train.{name}", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[-1].startswith(f"train.{name}: error: "), lines


def test_help_shows_every_default_once() -> None:
    """Options without a help string still show their default (the study's step counts were invisible),
    an absent default (None) or a switch's False is not printed, and a help text that explains its
    default is not given a second one."""
    from train.common.cli import Parser

    p = Parser(prog="p")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.0, help="peak rate")
    p.add_argument("--spm")
    p.add_argument("--fast", action="store_true")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    text = " ".join(p.format_help().split())
    assert "--steps STEPS (default: 1000)" in text and "peak rate (default: 0.0)" in text
    assert "None" not in text and "False" not in text
    assert text.count("default") == 3, text


def test_the_study_shows_its_step_counts() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "train.study", "--help"], cwd=REPO, env=env, capture_output=True, text=True
    )
    text = " ".join(r.stdout.split())
    for flag in (
        "--pretrain-steps PRETRAIN_STEPS",
        "--synth-steps SYNTH_STEPS",
        "--finetune-steps FINETUNE_STEPS",
    ):
        assert re.search(re.escape(flag) + r" [^-]*\(default: \d+\)", text), flag  # after its help, if any


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        ("pretrain", "--log-every", "0"),
        ("pretrain", "--save-every", "0"),
        ("pretrain", "--stop-after", "0"),
        ("finetune", "--batch-size", "0"),
        ("finetune", "--steps", "0"),
        ("finetune", "--eval-every", "0"),
        ("finetune", "--eval-batch-size", "0"),
        ("finetune", "--n-best", "0"),
        ("finetune", "--warmup", "-5"),
        ("finetune", "--threads", "0"),
    ],
)
def test_a_count_a_run_cannot_use_is_one_line_before_anything_runs(
    command: str, flag: str, value: str, tmp_path
) -> None:
    """A count the run would divide by or loop over (0 steps, log every 0 steps, 0 candidate spans)
    was a ZeroDivisionError mid-run or a run that silently did nothing: now one line naming the flag,
    exit 2, and no run directory."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    data = ["--train-file", "data/sample/train.json", "--dev-file", "data/sample/dev.json"]
    args = ["--config", "tiny", "--train-spm", "500", "--out", str(tmp_path / "run"), flag, value]
    r = subprocess.run(
        [sys.executable, "-m", f"train.{command}", *args, *(data if command == "finetune" else [])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    least = "0" if flag == "--warmup" else "1"
    assert r.stderr.strip().splitlines()[-1] == (
        f"train.{command}: error: {flag} must be at least {least}, got {value}"
    )
    assert not (tmp_path / "run").exists()
