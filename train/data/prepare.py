"""Tokenize a corpus once into shards (``train.data.shards``): the work of ``python -m train.prepare_corpus``.

The input is cut into *units* before anything is tokenized, from the bytes alone: a plain-text file at
blank lines (document ends) every ``shard_bytes`` or so, a JSONL file at line ends, a SQuAD JSON or any
gzip file whole. Unit ``k`` becomes shard ``k``. So the plan, and with it every shard, depends only on
the input and the options: a killed prepare redoes only the shards without a record, ``--num-tasks``
machines each take every ``num_tasks``-th unit, and the same input gives byte-identical shards.

Documents are read as ``train.common.corpus`` reads them (plain text: stripped lines, a blank line between
documents; SQuAD contexts and JSONL ``text`` fields split into sentences), and tokenized as
``train.data.streams.tokenize_documents`` does (a sentence start per encoded line, ``<eod>`` after each
document), so a prepared corpus holds exactly the token stream ``--corpus`` builds in memory.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from train.common.corpus import line_documents, read_squad_contexts
from train.common.text import split_sentences
from train.data.shards import id_dtype
from train.data.streams import encode_documents

DEFAULT_SHARD_MB = 64.0
DEFAULT_MAX_LINE_CHARS = (
    1_000_000  # longer lines are skipped and counted (a binary file, a dump without newlines)
)


@dataclass(frozen=True)
class Unit:
    """A piece of one input file that becomes one shard: bytes ``[begin, end)``, or the whole file."""

    path: str
    kind: str  # "text", "jsonl" or "squad"
    begin: int = 0
    end: int | None = None  # None: the whole file (gzip, SQuAD JSON)

    @property
    def source(self) -> str:
        return self.path if self.end is None else f"{self.path}:{self.begin}-{self.end}"

    @property
    def size(self) -> int:
        return Path(self.path).stat().st_size if self.end is None else self.end - self.begin


def input_kind(path: Path) -> tuple[str, bool]:
    """("text" | "jsonl" | "squad", gzip-compressed?) from the file name."""
    gz = path.suffix.lower() == ".gz"
    suffix = Path(path.stem).suffix.lower() if gz else path.suffix.lower()
    return {".json": "squad", ".jsonl": "jsonl"}.get(suffix, "text"), gz


def _cuts(path: Path, kind: str, shard_bytes: int) -> list[int]:
    """Byte offsets where units start: after a blank line (text) or a line end (jsonl), once at least
    ``shard_bytes`` have passed since the last cut."""
    cuts, position, last = [0], 0, 0
    with path.open("rb") as f:
        for line in f:
            position += len(line)
            if position - last >= shard_bytes and (kind == "jsonl" or not line.strip()):
                cuts.append(position)
                last = position
    if cuts[-1] == position and len(cuts) > 1:
        cuts.pop()  # no empty unit at the end
    return cuts


def plan_units(paths: Sequence[str | Path], shard_bytes: int) -> list[Unit]:
    """The units of all inputs, in order (the order of the token stream)."""
    if shard_bytes < 1:
        raise ValueError("--shard-mb must be positive")
    units: list[Unit] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
        kind, gz = input_kind(path)
        if gz or kind == "squad":
            units.append(Unit(str(path), kind))
            continue
        size = path.stat().st_size
        cuts = _cuts(path, kind, shard_bytes)
        units += [Unit(str(path), kind, a, b) for a, b in zip(cuts, [*cuts[1:], size], strict=True)]
    return units


def _decoded(unit: Unit) -> io.StringIO:
    """The unit's text, universal newlines as ``open()`` reads it; a clear error on non-UTF-8 bytes."""
    path = Path(unit.path)
    if unit.end is None and path.suffix.lower() == ".gz":
        try:
            with gzip.open(path, "rb") as f:
                data, begin = f.read(), 0
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: not a readable gzip file ({exc})") from None
    else:
        with path.open("rb") as f:
            f.seek(unit.begin)
            data, begin = f.read(None if unit.end is None else unit.end - unit.begin), unit.begin
    try:
        text = data.decode("utf-8-sig" if begin == 0 else "utf-8")
    except UnicodeDecodeError as exc:
        where = f"byte {begin + exc.start}" + (" of the decompressed data" if unit.end is None else "")
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at {where}); is it a binary file?") from None
    return io.StringIO(text, newline=None)


def iter_unit_documents(unit: Unit) -> Iterator[list[str]]:
    """The unit's documents (lists of sentences/lines), as ``train.common.corpus`` reads whole files."""
    if unit.kind == "squad":
        for context in read_squad_contexts(unit.path):
            if sentences := split_sentences(context):
                yield sentences
        return
    stream = _decoded(unit)
    if unit.kind == "jsonl":
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{unit.source}: line {number} is not JSON ({exc.msg})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f'{unit.source}: line {number} has no string "text" field')
            if sentences := split_sentences(" ".join(text.split())):
                yield sentences
        return
    yield from line_documents(stream)


@dataclass(frozen=True)
class Tokenized:
    ids: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    skipped_lines: int


def tokenize_unit(
    unit: Unit, encode: Callable[[str], list[int]], vocab_size: int, max_line_chars: int
) -> Tokenized:
    """Token ids, sentence starts and id counts of one unit (``encode_documents``, as ``--corpus`` in memory)."""
    encoded = encode_documents(iter_unit_documents(unit), encode, max_line_chars=max_line_chars)
    token_ids = encoded.ids
    if token_ids.size and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
        raise ValueError(f"{unit.source}: the tokenizer produced ids outside [0, {vocab_size})")
    return Tokenized(
        ids=token_ids.astype(id_dtype(vocab_size)),
        starts=encoded.starts,
        counts=np.bincount(token_ids, minlength=vocab_size).astype(np.int64),
        skipped_lines=encoded.skipped_lines,
    )


def plan_json(units: Sequence[Unit], options: dict) -> bytes:
    """The plan as stored beside the shards: a rerun with other inputs or options is refused."""
    return (json.dumps({"options": options, "units": [asdict(u) for u in units]}, indent=1) + "\n").encode()
