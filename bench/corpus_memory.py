"""Pretraining memory and start-up against corpus size: ``python -m bench.corpus_memory``.

    python -m bench.corpus_memory [--gb 1.0] [--small-mb 6] [--steps 20] [--workers 2] [--ranks 1] [--work DIR]

Builds two plain-text corpora from the shipped sample (seeded shuffles of its sentences into documents
of 3-8 sentences): a small one (``--small-mb``) and a large one (``--gb``). Prepares both with
``python -m train.prepare_corpus --workers N`` (MB/s per worker), then runs the same ``--steps``
pretraining steps on each with ``--data``, each in its own process: peak RSS (``wait4``'s ru_maxrss) and
start-up (launch to the first logged step); ``--ranks 2`` trains with torchrun on CPU ranks (the peak is
the largest process's). Prints a Markdown table with the machine and the command
lines (BENCHMARKS.md). Nothing runs in parallel with the timed runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import machine_line, markdown_table
from train.common.corpus import iter_texts
from train.common.sample_data import SAMPLE_CORPUS, SAMPLE_TRAIN

PROG = "python -m bench.corpus_memory"
REPO = Path(__file__).resolve().parents[1]


def build_corpus(path: Path, size_bytes: int, seed: int) -> int:
    """Write documents of 3-8 sample sentences (seeded) until ``size_bytes``; returns the size."""
    sentences = list(iter_texts([SAMPLE_CORPUS, SAMPLE_TRAIN]))
    rng = random.Random(seed)
    written = 0
    with path.open("w", encoding="utf-8") as f:
        while written < size_bytes:
            block = []
            for _ in range(2000):
                block.append("\n".join(rng.choice(sentences) for _ in range(rng.randint(3, 8))) + "\n\n")
            text = "".join(block)
            f.write(text)
            written += len(text.encode("utf-8"))
    return path.stat().st_size


def timed(cmd: list[str], log: Path, first_step: Path | None = None) -> dict[str, float]:
    """Run ``cmd`` (output to ``log``); wall time, its own peak RSS (MB) and, given ``first_step``, the
    seconds until that file holds a line (the first logged step)."""
    started, startup = time.monotonic(), None
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if (
                startup is None
                and first_step is not None
                and first_step.is_file()
                and first_step.stat().st_size
            ):
                startup = time.monotonic() - started
            if pid:
                break
            time.sleep(0.02)
    wall = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed; see {log}")
    return {
        "wall_s": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "startup_s": wall if startup is None else startup,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description="Pretraining memory and start-up against corpus size.")
    p.add_argument("--gb", type=float, default=1.0, help="size of the large corpus (GB)")
    p.add_argument("--small-mb", type=float, default=6.0, help="size of the small corpus (MB)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="train with torchrun on this many CPU ranks (peak RSS: the largest process)",
    )
    p.add_argument("--work", type=Path, default=Path("runs/bench-corpus"))
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    spm = work / "spm"
    if not (spm / "spiece.model").is_file():
        from train.tokenizer import train_spm

        train_spm([SAMPLE_CORPUS, SAMPLE_TRAIN], spm, 4000)
    rows, results = [], {}
    for name, size in (("small", int(args.small_mb * 1e6)), ("large", int(args.gb * 1e9))):
        text = work / f"{name}.txt"
        if not text.is_file() or text.stat().st_size < size:
            print(f"building {text} ({size / 1e6:,.0f} MB) ...", flush=True)
            build_corpus(text, size, seed=len(name))
        data = work / f"{name}-data"
        prep_cmd = [sys.executable, "-m", "train.prepare_corpus", "--corpus", str(text), "--spm", str(spm)]
        prep_cmd += ["--out", str(data), "--workers", str(args.workers)]
        prep = (
            timed(prep_cmd, work / f"{name}-prepare.log") if not (data / "manifest.json").is_file() else None
        )
        tokens = json.loads((data / "manifest.json").read_text())["tokens"]
        run = work / f"{name}-run"
        shutil.rmtree(run, ignore_errors=True)  # start-up is read off its metrics file: none may be left
        launcher = [sys.executable]
        if args.ranks > 1:  # wait4 on torchrun reports the largest of it and its reaped ranks
            launcher += [
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(args.ranks),
                "--master_port",
                "29533",
            ]
        train_cmd = [
            *launcher,
            "-m",
            "train.pretrain",
            "--data",
            str(data),
            "--config",
            "tiny",
            "--device",
            "cpu",
        ]
        train_cmd += ["--steps", str(args.steps), "--log-every", "1", "--out", str(run), "--overwrite"]
        train = timed(train_cmd, work / f"{name}-train.log", first_step=run / "metrics.jsonl")
        mb = text.stat().st_size / 1e6
        per_worker = mb / prep["wall_s"] / args.workers if prep else float("nan")
        results[name] = {"mb": mb, "tokens": tokens, "prepare": prep, "train": train}
        rows.append(
            [
                name,
                f"{mb:,.0f}",
                f"{tokens:,}",
                f"{per_worker:.2f}" if prep else "(prepared before)",
                f"{train['peak_rss_mb']:,.0f}",
                f"{train['startup_s']:.1f}",
                f"{train['wall_s']:.1f}",
            ]
        )
        print(f"{name}: {' '.join(train_cmd)}", flush=True)
    print(machine_line(1))
    header = [
        "corpus",
        "MB",
        "tokens",
        "prepare MB/s/worker",
        "peak RSS MB",
        "start-up s",
        f"{args.steps} steps wall s",
    ]
    print(markdown_table(header, rows))
    small, large = results["small"]["train"], results["large"]["train"]
    print(
        f"large - small peak RSS: {large['peak_rss_mb'] - small['peak_rss_mb']:+.0f} MB; "
        f"start-up ratio {large['startup_s'] / small['startup_s']:.2f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
