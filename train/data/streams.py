"""The corpus as one token array, and its split into parallel streams (the batch axis).

Mirrors `_create_data` + `batchify` + the `bi_data` layout of `create_tfrecords` in the original
`data_utils.py`: documents are tokenised sentence by sentence (sentence ids are kept so that segments A
and B are cut at sentence boundaries), an `<eod>` closes every document, everything is concatenated,
and the array is cut into contiguous slices, one per stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from train.contract import EOD_ID


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


def tokenize_documents(
    documents: Iterable[Sequence[str]], encode: Callable[[str], list[int]], eod_id: int = EOD_ID
) -> TokenStream:
    """Tokenise `documents` (each a list of sentences/lines) into one `TokenStream`.

    Sentences that encode to nothing are dropped, empty documents too. Each document ends with `<eod>`
    (the original turns the blank line after a document into `<eod>`).
    """
    ids: list[int] = []
    sent: list[int] = []
    sentence = 0
    for doc in documents:
        wrote = False
        for line in doc:
            pieces = encode(line.strip()) if line.strip() else []
            if not pieces:
                continue
            ids.extend(pieces)
            sent.extend([sentence] * len(pieces))
            sentence += 1
            wrote = True
        if wrote:
            ids.append(eod_id)
            sent.append(sentence - 1)
    return TokenStream(ids=np.asarray(ids, dtype=np.int32), sentence_ids=np.asarray(sent, dtype=np.int32))


@dataclass(frozen=True)
class StreamRows:
    """The streams one rank reads: row `r` of `ids`/`sentence_ids` is stream `r` of its batch.

    With `bi_data` the first half of the rows are forward streams and the second half are the same
    streams reversed (`reversed_rows[r]` says which), exactly the per-core layout of the original.
    `boundaries[r]` lists the positions `p` of row `r` with `sentence_ids[r, p] != sentence_ids[r, p-1]`.
    """

    ids: np.ndarray
    sentence_ids: np.ndarray
    reversed_rows: np.ndarray
    boundaries: list[np.ndarray]

    @property
    def stream_len(self) -> int:
        return int(self.ids.shape[1])


def num_forward_streams(batch_size: int, world_size: int, bi_data: bool) -> int:
    """How many contiguous slices the corpus is cut into (over all ranks)."""
    total = batch_size * world_size
    return total // 2 if bi_data else total


def stream_rows(
    stream: TokenStream, batch_size: int, *, bi_data: bool = False, rank: int = 0, world_size: int = 1
) -> StreamRows:
    """Cut `stream` into parallel streams and return the ones owned by `rank`.

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
    n_fwd = num_forward_streams(batch_size, world_size, bi_data)
    step = len(stream) // n_fwd
    ids = stream.ids[: n_fwd * step].reshape(n_fwd, step)
    sent = stream.sentence_ids[: n_fwd * step].reshape(n_fwd, step)
    per_rank = n_fwd // world_size
    ids = ids[rank * per_rank : (rank + 1) * per_rank]
    sent = sent[rank * per_rank : (rank + 1) * per_rank]
    reversed_rows = np.zeros(batch_size, dtype=bool)
    if bi_data:
        ids = np.concatenate([ids, ids[:, ::-1]], axis=0)
        sent = np.concatenate([sent, sent[:, ::-1]], axis=0)
        reversed_rows[per_rank:] = True
    ids = np.ascontiguousarray(ids)
    sent = np.ascontiguousarray(sent)
    boundaries = [np.flatnonzero(row[1:] != row[:-1]) + 1 for row in sent]
    return StreamRows(ids=ids, sentence_ids=sent, reversed_rows=reversed_rows, boundaries=boundaries)
