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

:func:`prepare_directory` runs a plan into a directory (worker processes, resumable, ``--num-tasks``);
it lives here, not in the command, because pretraining's ``--corpus`` prepares into its run directory
with it too.
"""

from __future__ import annotations

import gzip
import io
import json
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qa_core.text import split_sentences
from qa_core.tokenizer import XLNetTokenizer
from train.common.atomic_dir import atomic_directory, atomic_write_bytes, recover_interrupted
from train.common.corpus import line_documents, read_squad_contexts
from train.data.prepare_options import DEFAULT_MAX_LINE_CHARS, DEFAULT_SHARD_MB
from train.data.shards import MANIFEST, TOKENIZER_DIR, build_manifest, id_dtype, read_record, write_shard
from train.data.streams import encode_documents

# The command whose work this is: its progress lines carry its name, wherever they are printed from.
PROG = "python -m train.prepare_corpus"
PLAN = "plan.json"

_worker: dict[str, Any] = {}


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
