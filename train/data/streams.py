"""The corpus as one token array, and its split into parallel streams (the batch axis).

Mirrors `_create_data` + `batchify` + the `bi_data` layout of `create_tfrecords` in the original
`data_utils.py`: documents are tokenised sentence by sentence (sentence ids are kept so that segments A
and B are cut at sentence boundaries), an `<eod>` closes every document, everything is concatenated,
and the array is cut into contiguous slices, one per stream.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qa_core.contract import EOD_ID
from train.data.rows import ArrayCorpus, Corpus, Row, RowBoundaries


@dataclass(frozen=True)
class TokenStream:
    """The tokenised corpus.

    ids:          int32 [N] token ids, documents back to back, each closed by `<eod>`.
    sentence_ids: int32 [N] index of the sentence each token belongs to (non-decreasing); a segment
                  boundary may only fall where it changes. As in the original, the `<eod>` token shares
                  the id of its document's last sentence (it is glued to that sentence).
    """

    ids: np.ndarray
    sentence_ids: np.ndarray

    def __post_init__(self) -> None:
        if self.ids.ndim != 1 or self.ids.shape != self.sentence_ids.shape:
            raise ValueError(
                f"ids and sentence_ids must be 1-D and of equal length, got {self.ids.shape} "
                f"and {self.sentence_ids.shape}"
            )

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def save(self, path: str | Path) -> None:
        """Cache the tokenised corpus (`.npz`) so large corpora are tokenised once."""
        np.savez(path, ids=self.ids, sentence_ids=self.sentence_ids)

    @classmethod
    def load(cls, path: str | Path) -> TokenStream:
        with np.load(path) as f:
            return cls(ids=f["ids"].astype(np.int32), sentence_ids=f["sentence_ids"].astype(np.int32))


@dataclass(frozen=True)
class EncodedDocuments:
    """Documents as token ids (int32, each document closed by `<eod>`), the positions where a sentence
    starts (int64), and how many lines were left out for being longer than asked."""

    ids: np.ndarray
    starts: np.ndarray
    skipped_lines: int = 0


def encode_documents(
    documents: Iterable[Sequence[str]],
    encode: Callable[[str], list[int]],
    eod_id: int = EOD_ID,
    max_line_chars: int | None = None,
) -> EncodedDocuments:
    """The one tokenisation of pretraining text: a sentence start per line that encodes to something
    (lines that encode to nothing are dropped, empty documents too), `<eod>` after each document (the
    original turns the blank line after a document into `<eod>`). Built in compact arrays (4 bytes a
    token), since a prepared shard holds tens of millions of tokens."""
    ids, starts = array.array("i"), array.array("q")
    skipped = 0
    for doc in documents:
        wrote = False
        for line in doc:
            line = line.strip()
            if max_line_chars is not None and len(line) > max_line_chars:
                skipped += 1
                continue
            pieces = encode(line) if line else []
            if not pieces:
                continue
            starts.append(len(ids))
            ids.extend(pieces)
            wrote = True
        if wrote:
            ids.append(eod_id)
    return EncodedDocuments(
        ids=np.frombuffer(ids, dtype=np.int32) if ids else np.zeros(0, np.int32),
        starts=np.frombuffer(starts, dtype=np.int64) if starts else np.zeros(0, np.int64),
        skipped_lines=skipped,
    )


def tokenize_documents(
    documents: Iterable[Sequence[str]], encode: Callable[[str], list[int]], eod_id: int = EOD_ID
) -> TokenStream:
    """Tokenise `documents` (each a list of sentences/lines) into one `TokenStream` (see
    :func:`encode_documents`); the `<eod>` shares the sentence id of its document's last sentence."""
    encoded = encode_documents(documents, encode, eod_id)
    sentence_ids = np.searchsorted(encoded.starts, np.arange(len(encoded.ids)), side="right") - 1
    return TokenStream(ids=encoded.ids.copy(), sentence_ids=sentence_ids.astype(np.int32))


@dataclass(frozen=True)
class StreamRows:
    """The streams one rank reads: ``rows[r]`` is stream ``r`` of its batch, read lazily (``train.data.rows``).

    With `bi_data` the first half of the rows are forward streams and the second half are the same
    streams reversed (`reversed_rows[r]` says which), exactly the per-core layout of the original.
    `boundaries[r]` gives the positions `p` of row `r` where a new sentence starts (p > 0).
    """

    rows: list[Row]
    boundaries: list[RowBoundaries]
    reversed_rows: np.ndarray
    stream_len: int

    @property
    def ids(self) -> np.ndarray:
        """All rows as one [rows, stream_len] array: a copy of the rank's whole share (small corpora only)."""
        return np.stack([row.to_array() for row in self.rows]) if self.rows else np.zeros((0, 0), np.int64)


def num_forward_streams(batch_size: int, world_size: int, bi_data: bool) -> int:
    """How many contiguous slices the corpus is cut into (over all ranks)."""
    total = batch_size * world_size
    return total // 2 if bi_data else total


def as_corpus(stream: TokenStream | Corpus) -> Corpus:
    """A token stream in memory, or a prepared (memory-mapped) corpus, as a :class:`Corpus`."""
    if isinstance(stream, TokenStream):
        return ArrayCorpus.from_sentence_ids(stream.ids, stream.sentence_ids)
    return stream


def stream_rows(
    stream: TokenStream | Corpus,
    batch_size: int,
    *,
    bi_data: bool = False,
    rank: int = 0,
    world_size: int = 1,
) -> StreamRows:
    """Cut the corpus into parallel streams and return the ones owned by `rank`, without reading them.

    The corpus is cut into `num_forward_streams` contiguous equal slices (the tail that does not fill a
    slice is dropped, like `batchify`). Rank `k` owns the forward slices `[k*h, (k+1)*h)` with
    `h = batch_size` (or `batch_size // 2` with `bi_data`, the other half being those slices
    reversed), so ranks never share a stream and the global layout equals the original's
    `bsz_per_host` layout with one core per rank.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    if bi_data and batch_size % 2:
        raise ValueError(f"bi_data=True needs an even batch_size, got {batch_size}")
    corpus = as_corpus(stream)
    n_fwd = num_forward_streams(batch_size, world_size, bi_data)
    step = len(corpus) // n_fwd
    per_rank = n_fwd // world_size
    forward = [Row(corpus, (rank * per_rank + k) * step, step) for k in range(per_rank)]
    rows = forward + ([Row(corpus, r.start, step, reverse=True) for r in forward] if bi_data else [])
    reversed_rows = np.zeros(batch_size, dtype=bool)
    if bi_data:
        reversed_rows[per_rank:] = True
    return StreamRows(
        rows=rows, boundaries=[RowBoundaries(r) for r in rows], reversed_rows=reversed_rows, stream_len=step
    )
