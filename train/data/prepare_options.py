"""What ``python -m train.prepare_corpus`` takes: one :class:`PrepareOptions`, each field a flag of the
command (:mod:`train.common.dataclass_flags`), checked on construction."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from train.common.dataclass_flags import flag

DEFAULT_SHARD_MB = 64.0
# Longer lines are skipped and counted: a binary file or a dump without newlines.
DEFAULT_MAX_LINE_CHARS = 1_000_000
DEFAULT_WORKERS = max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True, kw_only=True)
class PrepareOptions:
    """A corpus, its tokenizer and where its shards go; how the work is split."""

    corpus: list[str] = flag(help="text, SQuAD .json or .jsonl files (.gz too)")
    spm: str = flag(help="sentencepiece model (spiece.model or a directory holding one)")
    lower: bool = flag(False, help="lower-case (an spm file without tokenizer_config)")
    out: Path = flag(help="directory for the shards (resumed when it holds some)")
    workers: int = flag(DEFAULT_WORKERS, help="processes")
    shard_mb: float = flag(DEFAULT_SHARD_MB, help="input text per shard (MB)")
    max_line_chars: int = flag(
        DEFAULT_MAX_LINE_CHARS,
        help="lines longer than this are skipped and counted (a binary file or a dump without newlines)",
    )
    num_tasks: int = flag(1, help="machines sharing the work")
    task: int = flag(0, help="this machine's index in [0, num-tasks)")

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("--workers must be >= 1")
        if self.num_tasks < 1 or not 0 <= self.task < self.num_tasks:
            raise ValueError(
                f"need 0 <= --task < --num-tasks, got --task {self.task} --num-tasks {self.num_tasks}"
            )
        if self.max_line_chars < 1:
            raise ValueError("--max-line-chars must be positive")
        if self.shard_mb <= 0:
            raise ValueError("--shard-mb must be positive")
