"""Tokenize a pretraining corpus once, into memory-mappable shards that ``train.pretrain --data`` reads.

    python -m train.prepare_corpus --corpus FILE... --spm spiece.model --out DIR \\
        [--workers N] [--shard-mb 64] [--max-line-chars N] [--num-tasks K --task T]

Inputs: plain text (a blank line between documents), SQuAD JSON, JSONL with a ``text`` field, each
optionally ``.gz``. Shards are tokenized in parallel worker processes (tqdm: MB/s, tokens/s), each
written atomically with its record last, so a killed prepare continues where it stopped and gives the
same bytes as an uninterrupted one. ``--num-tasks K --task T`` prepares every K-th shard (machine T of K,
as the original's ``--num_task/--task``) into one shared directory; whichever task finds every shard done
writes ``manifest.json``, which training requires. Format: ``train.data.shards``; plan and work:
``train.data.prepare`` (this module only parses the flags).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from train.common.cli import Parser, run
from train.data.prepare import (
    DEFAULT_MAX_LINE_CHARS,
    DEFAULT_SHARD_MB,
    PROG,
    load_tokenizer,
    prepare_directory,
)


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


def check_args(args) -> None:
    if args.workers < 1:
        raise ValueError("--workers must be >= 1")
    if args.num_tasks < 1 or not 0 <= args.task < args.num_tasks:
        raise ValueError(
            f"need 0 <= --task < --num-tasks, got --task {args.task} --num-tasks {args.num_tasks}"
        )
    if args.max_line_chars < 1:
        raise ValueError("--max-line-chars must be positive")


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


def _main(argv: Sequence[str] | None) -> int:
    return prepare(build_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: bad input -> one line and exit 2; a write that fails (disk full) -> exit 1."""
    return run(_main, argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
