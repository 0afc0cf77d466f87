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

import sys
from collections.abc import Sequence

from train.common.cli import Parser, run
from train.common.dataclass_flags import add_flags, options_from
from train.data.prepare import PROG, load_tokenizer, prepare_directory
from train.data.prepare_options import PrepareOptions


def build_parser() -> Parser:
    """One flag per field of :class:`PrepareOptions` (its type, default and help)."""
    p = Parser(prog=PROG, description="Tokenize a corpus into shards for train.pretrain --data.")
    add_flags(p, PrepareOptions)
    return p


def prepare(options: PrepareOptions) -> int:
    prepare_directory(
        options.corpus,
        load_tokenizer(options.spm, options.lower),
        options.out,
        workers=options.workers,
        shard_mb=options.shard_mb,
        max_line_chars=options.max_line_chars,
        num_tasks=options.num_tasks,
        task=options.task,
    )
    return 0


def _main(argv: Sequence[str] | None) -> int:
    return prepare(options_from(PrepareOptions, build_parser().parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: bad input -> one line and exit 2; a write that fails (disk full) -> exit 1."""
    return run(_main, argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
