"""A prepared pretraining corpus on disk: token ids in shards, memory-mapped by training.

``python -m train.prepare_corpus`` writes, into one directory::

    manifest.json             format, tokenizer fingerprint, dtype, options, shards (tokens, sha256)
    tokenizer/                the tokenizer the ids come from (spiece.model + tokenizer_config.json)
    shard-00000.ids           token ids, documents back to back, each closed by <eod> (uint16 or uint32)
    shard-00000.starts        int64 positions inside the shard where a sentence starts
    shard-00000.counts        int64 [vocab] how often each id occurs (the unigram baseline, without a scan)
    shard-00000.json          the shard's record; written last, so a shard without it is unfinished

Training opens the shards with ``np.memmap`` (:class:`ShardedCorpus`): nothing is read until a batch
needs it, and a rank touches only the pages of its own streams, so memory does not grow with the
corpus. Torch-free.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from qa_core.digests import sha256_bytes, sha256_file
from train.common.atomic_dir import atomic_write_bytes

FORMAT = "xlnet-qa-corpus/1"
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
SUFFIXES = ("ids", "starts", "counts")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def id_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (half the disk and page cache of uint32)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class ShardRecord:
    """One finished shard: what it holds and the digests of its files."""

    index: int
    source: str  # "<file>:<first byte>-<end byte>" (or "<file>" for a whole-file unit)
    tokens: int
    sentences: int
    max_id: int
    skipped_lines: int  # lines longer than --max-line-chars, counted and left out
    sha256: dict[str, str]

    @property
    def name(self) -> str:
        return shard_name(self.index)


def write_shard(
    directory: Path,
    index: int,
    source: str,
    ids: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    skipped_lines: int,
) -> ShardRecord:
    """Write one shard's files atomically, then its record (the commit: a shard without it is redone)."""
    name = shard_name(index)
    payloads = {"ids": ids.tobytes(), "starts": starts.astype(np.int64).tobytes(), "counts": counts.tobytes()}
    for suffix, data in payloads.items():
        atomic_write_bytes(directory / f"{name}.{suffix}", data)
    record = ShardRecord(
        index=index,
        source=source,
        tokens=int(ids.shape[0]),
        sentences=int(starts.shape[0]),
        max_id=int(ids.max()) if ids.size else -1,
        skipped_lines=skipped_lines,
        sha256={suffix: sha256_bytes(data) for suffix, data in payloads.items()},
    )
    atomic_write_bytes(directory / f"{name}.json", (json.dumps(asdict(record), indent=1) + "\n").encode())
    return record


def read_record(directory: Path, index: int) -> ShardRecord | None:
    """The shard's record if it is finished: the record is written after its files, so it exists only
    for a shard whose files are complete (None for a missing or unreadable record)."""
    path = directory / f"{shard_name(index)}.json"
    if not path.is_file():
        return None
    try:
        record = ShardRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None
    return record


def build_manifest(
    directory: Path, records: Sequence[ShardRecord], tokenizer: dict[str, Any], options: dict[str, Any]
) -> dict[str, Any]:
    """The manifest of finished shards, written atomically (the corpus is usable once it exists)."""
    ordered = sorted(records, key=lambda r: r.index)
    manifest = {
        "format": FORMAT,
        "tokenizer": tokenizer,
        "dtype": id_dtype(tokenizer["vocab_size"]).name,
        "options": options,
        "tokens": sum(r.tokens for r in ordered),
        "sentences": sum(r.sentences for r in ordered),
        "max_id": max((r.max_id for r in ordered), default=-1),
        "skipped_lines": sum(r.skipped_lines for r in ordered),
        "shards": [asdict(r) for r in ordered],
    }
    atomic_write_bytes(directory / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


class CorpusError(ValueError):
    """A prepared corpus that cannot be used as it is (missing, unfinished, changed, wrong tokenizer)."""


class ShardedCorpus:
    """A prepared corpus as one :class:`train.data.rows.Corpus`: global positions over the shards."""

    def __init__(self, directory: str | os.PathLike, *, verify: bool = False) -> None:
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        if not path.is_file():
            raise CorpusError(
                f"{self.directory}: no {MANIFEST} (prepare it with python -m train.prepare_corpus; an "
                "unfinished prepare writes it only when every shard is done)"
            )
        try:
            self.manifest = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}: not JSON ({exc.msg})") from None
        if self.manifest.get("format") != FORMAT:
            raise CorpusError(f"{path}: format {self.manifest.get('format')!r}, expected {FORMAT!r}")
        self.dtype = np.dtype(self.manifest["dtype"])
        self.records = [ShardRecord(**r) for r in self.manifest["shards"]]
        self._ids: list[np.ndarray] = []
        self._starts: list[np.ndarray] = []
        for record in self.records:
            if verify:
                self._verify(record)
            self._ids.append(self._map(record, "ids", self.dtype, record.tokens))
            self._starts.append(self._map(record, "starts", np.dtype(np.int64), record.sentences))
        self._token_offsets = np.cumsum([0] + [r.tokens for r in self.records]).tolist()
        self._start_offsets = np.cumsum([0] + [r.sentences for r in self.records]).tolist()

    def _map(self, record: ShardRecord, suffix: str, dtype: np.dtype, count: int) -> np.ndarray:
        path = self.directory / f"{record.name}.{suffix}"
        if not path.is_file() or path.stat().st_size != count * dtype.itemsize:
            raise CorpusError(f"{path}: missing or not {count * dtype.itemsize} bytes as the manifest says")
        if count == 0:
            return np.zeros(0, dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))

    def _verify(self, record: ShardRecord) -> None:
        for suffix in SUFFIXES:
            path = self.directory / f"{record.name}.{suffix}"
            if not path.is_file() or sha256_file(path) != record.sha256[suffix]:
                raise CorpusError(f"{path}: its sha256 differs from the manifest's (changed or damaged)")

    # -- the Corpus protocol (train.data.rows) -------------------------------------------------------
    def __len__(self) -> int:
        return int(self._token_offsets[-1])

    def ids(self, begin: int, end: int) -> np.ndarray:
        begin, end = max(0, begin), min(len(self), end)
        if end <= begin:
            return np.zeros(0, np.int64)
        parts = []
        shard = bisect.bisect_right(self._token_offsets, begin) - 1
        while begin < end:
            offset = self._token_offsets[shard]
            stop = min(end, self._token_offsets[shard + 1])
            parts.append(np.asarray(self._ids[shard][begin - offset : stop - offset], dtype=np.int64))
            begin, shard = stop, shard + 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def count_starts(self, position: int, side: Literal["left", "right"]) -> int:
        if position < 0:
            return 0
        if position >= len(self):  # every start lies before the end
            return int(self._start_offsets[-1])
        shard = bisect.bisect_right(self._token_offsets, position) - 1
        local = position - self._token_offsets[shard]
        return int(self._start_offsets[shard] + np.searchsorted(self._starts[shard], local, side=side))

    def start_at(self, index: int) -> int:
        shard = bisect.bisect_right(self._start_offsets, index) - 1
        return int(self._token_offsets[shard] + self._starts[shard][index - self._start_offsets[shard]])

    def max_id(self) -> int:
        return int(self.manifest["max_id"])

    # -- facts for training ----------------------------------------------------------------------------
    @property
    def tokenizer_fingerprint(self) -> str:
        return str(self.manifest["tokenizer"]["sha256"])

    def require_tokenizer(self, fingerprint: str, source: str) -> None:
        """Refuse to feed these ids to a model of another tokenizer (the same id is another piece there);
        the error names both fingerprints and where the model's tokenizer comes from."""
        if fingerprint != self.tokenizer_fingerprint:
            raise CorpusError(
                f"{self.directory}: its token ids come from another tokenizer ({self.tokenizer_fingerprint[:12]}) "
                f"than {source}'s ({fingerprint[:12]}): prepare the corpus again with that tokenizer "
                "(python -m train.prepare_corpus --spm ...)"
            )

    def unigram_counts(self) -> np.ndarray:
        """How often each id occurs in the whole corpus (summed from the shards' counts files)."""
        total = np.zeros(int(self.manifest["tokenizer"]["vocab_size"]), np.int64)
        for record in self.records:
            total += np.fromfile(self.directory / f"{record.name}.counts", dtype=np.int64)
        return total
