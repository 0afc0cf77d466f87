"""Tokenize a pretraining corpus once, into memory-mappable shards that ``train.pretrain --data`` reads.

    python -m train.prepare_corpus --corpus FILE... --spm spiece.model --out DIR \\
        [--workers N] [--shard-mb 64] [--max-line-chars N] [--num-tasks K --task T]

Inputs: plain text (a blank line between documents), SQuAD JSON, JSONL with a ``text`` field, each
optionally ``.gz``. Shards are tokenized in parallel worker processes (tqdm: MB/s, tokens/s), each
written atomically with its record last, so a killed prepare continues where it stopped and gives the
same bytes as an uninterrupted one. ``--num-tasks K --task T`` prepares every K-th shard (machine T of K,
as the original's ``--num_task/--task``) into one shared directory; whichever task finds every shard done
writes ``manifest.json``, which training requires. Format: ``train.data.shards``; plan: ``train.data.prepare``.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from train.common.atomic_dir import atomic_directory, atomic_write_bytes, recover_interrupted
from train.common.cli import Parser, run
from train.data.prepare import (
    DEFAULT_MAX_LINE_CHARS,
    DEFAULT_SHARD_MB,
    Unit,
    plan_json,
    plan_units,
    tokenize_unit,
)
from train.data.shards import MANIFEST, TOKENIZER_DIR, build_manifest, read_record, write_shard
from train.tokenizer import XLNetTokenizer

PROG = "python -m train.prepare_corpus"
PLAN = "plan.json"

_worker: dict[str, Any] = {}


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Tokenize a corpus into shards for train.pretrain --data.")
    p.add_argument("--corpus", nargs="+", required=True, help="text, SQuAD .json or .jsonl files (.gz too)")
    p.add_argument(
        "--spm", required=True, help="sentencepiece model (spiece.model or a directory holding one)"
    )
    p.add_argument("--lower", action="store_true", help="lower-case (an spm file without tokenizer_config)")
    p.add_argument("--out", required=True, help="directory for the shards (resumed when it holds some)")
    p.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)), help="processes")
    p.add_argument("--shard-mb", type=float, default=DEFAULT_SHARD_MB, help="input text per shard (MB)")
    p.add_argument(
        "--max-line-chars",
        type=int,
        default=DEFAULT_MAX_LINE_CHARS,
        help="lines longer than this are skipped and counted (a binary file or a dump without newlines)",
    )
    p.add_argument("--num-tasks", type=int, default=1, help="machines sharing the work")
    p.add_argument("--task", type=int, default=0, help="this machine's index in [0, num-tasks)")
    return p


def load_tokenizer(spm: str | Path, lower: bool) -> XLNetTokenizer:
    path = Path(spm)
    return XLNetTokenizer.from_dir(path) if path.is_dir() else XLNetTokenizer(path, do_lower_case=lower)


def tokenizer_facts(tokenizer: XLNetTokenizer) -> dict[str, Any]:
    return {"sha256": tokenizer.fingerprint(), "vocab_size": tokenizer.vocab_size}


def _init_worker(tokenizer_dir: str) -> None:
    _worker["tokenizer"] = XLNetTokenizer.from_dir(tokenizer_dir)


def _prepare_one(job: tuple[int, Unit, str, int]) -> tuple[int, int, int]:
    """Tokenize and write one shard (in a worker); returns (index, input bytes, tokens)."""
    index, unit, out, max_line_chars = job
    tokenizer: XLNetTokenizer = _worker["tokenizer"]
    done = tokenize_unit(unit, tokenizer.encode, tokenizer.vocab_size, max_line_chars)
    write_shard(Path(out), index, unit.source, done.ids, done.starts, done.counts, done.skipped_lines)
    return index, unit.size, int(done.ids.shape[0])


def check_args(args) -> None:
    if args.workers < 1:
        raise ValueError("--workers must be >= 1")
    if args.num_tasks < 1 or not 0 <= args.task < args.num_tasks:
        raise ValueError(
            f"need 0 <= --task < --num-tasks, got --task {args.task} --num-tasks {args.num_tasks}"
        )
    if args.max_line_chars < 1:
        raise ValueError("--max-line-chars must be positive")


def claim_directory(out: Path, tokenizer: XLNetTokenizer, units: list[Unit], options: dict[str, Any]) -> None:
    """Make ``out`` hold this tokenizer and plan, or refuse: shards of another tokenizer, input or options
    must never be mixed into one corpus."""
    out.mkdir(parents=True, exist_ok=True)
    recover_interrupted(out)  # temporary files of a killed prepare
    tok_dir = out / TOKENIZER_DIR
    if (tok_dir / "spiece.model").is_file():
        theirs = XLNetTokenizer.from_dir(tok_dir).fingerprint()
        if theirs != tokenizer.fingerprint():
            raise ValueError(f"--out {out}: prepared with another tokenizer ({theirs[:12]}); use a new --out")
    else:  # whole or not at all: a killed or failed save must not leave a truncated model to read next time
        with atomic_directory(tok_dir) as tmp:
            tokenizer.save(tmp)
    plan = plan_json(units, options)
    path = out / PLAN
    if path.is_file() and path.read_bytes() != plan:
        raise ValueError(f"--out {out}: prepared from other input files or options ({path}); use a new --out")
    if not path.is_file():
        atomic_write_bytes(path, plan)


def prepare(args) -> int:
    check_args(args)
    prepare_directory(
        args.corpus,
        load_tokenizer(args.spm, args.lower),
        Path(args.out),
        workers=args.workers,
        shard_mb=args.shard_mb,
        max_line_chars=args.max_line_chars,
        num_tasks=args.num_tasks,
        task=args.task,
    )
    return 0


def prepare_directory(
    corpus: Sequence[str | Path],
    tokenizer: XLNetTokenizer,
    out: Path,
    *,
    workers: int = 1,
    shard_mb: float = DEFAULT_SHARD_MB,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    num_tasks: int = 1,
    task: int = 0,
    report: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Prepare (or finish preparing) ``out``; the manifest once every shard exists, else None."""
    units = plan_units(corpus, int(shard_mb * 1e6))
    options = {
        "inputs": [str(Path(c)) for c in corpus],
        "shard_mb": shard_mb,
        "max_line_chars": max_line_chars,
    }
    claim_directory(out, tokenizer, units, options)
    mine = [k for k in range(len(units)) if k % num_tasks == task]
    todo = [k for k in mine if read_record(out, k) is None]
    total_bytes = sum(units[k].size for k in todo)
    report(
        f"{PROG}: {len(units)} shards planned, {len(mine) - len(todo)} of this task's {len(mine)} already done; "
        f"{total_bytes / 1e6:.1f} MB to tokenize with {workers} worker(s)"
    )
    _run_jobs(todo, units, out, workers, max_line_chars, total_bytes)
    records = [read_record(out, k) for k in range(len(units))]
    missing = [k for k, r in enumerate(records) if r is None]
    if missing:
        report(
            f"{PROG}: this task is done; {len(missing)} shard(s) of other tasks still missing: no manifest yet"
        )
        return None
    manifest = build_manifest(out, [r for r in records if r is not None], tokenizer_facts(tokenizer), options)
    if manifest["tokens"] == 0:
        (out / MANIFEST).unlink()
        raise ValueError(f"no text in {[str(c) for c in corpus]}: every input is empty (no manifest written)")
    skipped = f", {manifest['skipped_lines']} over-long lines skipped" if manifest["skipped_lines"] else ""
    report(f"wrote {out / MANIFEST}: {manifest['tokens']:,} tokens in {len(units)} shard(s){skipped}")
    return manifest


def _run_jobs(
    todo: list[int], units: list[Unit], out: Path, workers: int, max_line_chars: int, total_bytes: int
) -> None:
    from tqdm import tqdm

    jobs = [(k, units[k], str(out), max_line_chars) for k in todo]
    if not jobs:
        return
    workers = min(workers, len(jobs))
    started, tokens = time.monotonic(), 0
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", file=sys.stderr)

    def done(size: int, count: int) -> None:
        nonlocal tokens
        tokens += count
        bar.update(size)
        elapsed = max(time.monotonic() - started, 1e-9)
        per_worker = bar.n / elapsed / 1e6 / workers
        bar.set_postfix(tokens_per_s=f"{tokens / elapsed:,.0f}", mb_per_s_per_worker=f"{per_worker:.2f}")

    try:  # the bar is closed before any error is reported, so the error is the last line
        if workers == 1:  # in this process: no start-up cost for small corpora
            _init_worker(str(out / TOKENIZER_DIR))
            for job in jobs:
                done(*_prepare_one(job)[1:])
        else:
            context = multiprocessing.get_context("spawn")  # no inherited state (threads, open files)
            initargs = (str(out / TOKENIZER_DIR),)
            with context.Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
                for _, size, count in pool.imap_unordered(_prepare_one, jobs):
                    done(size, count)
    finally:
        bar.close()


def _main(argv: Sequence[str] | None) -> int:
    return prepare(build_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: bad input -> one line and exit 2; a write that fails (disk full) -> exit 1."""
    return run(_main, argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
