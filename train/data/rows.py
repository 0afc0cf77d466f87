"""One rank's streams, read where they lie: a contiguous slice of the corpus per stream, forward or
reversed (``bi_data``), and the sentence starts inside it, without copying the stream.

A prepared corpus is memory-mapped (``train.data.shards``), so a rank must never materialise its rows:
a stream of a 3-billion-token corpus cut 32 ways is ~90 M tokens. Examples read a few hundred tokens at
a time (:class:`Row` slices) and look sentence boundaries up by binary search (:class:`RowBoundaries`),
so memory stays constant in the corpus size. An in-memory :class:`TokenStream` is the same thing with
the arrays in RAM (:class:`ArrayCorpus`).
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np

Side = Literal["left", "right"]


class Corpus(Protocol):
    """Token ids and sentence starts of a whole corpus (global positions)."""

    def __len__(self) -> int: ...

    def ids(self, begin: int, end: int) -> np.ndarray:
        """Token ids of ``[begin, end)`` as a fresh int64 array."""
        ...

    def count_starts(self, position: int, side: Side) -> int:
        """Sentence starts before ``position`` ("left") or at or before it ("right")."""
        ...

    def start_at(self, index: int) -> int:
        """Global position of the ``index``-th sentence start."""
        ...

    def max_id(self) -> int:
        """The largest token id (-1 when empty): checked against the tokenizer without a scan."""
        ...


class ArrayCorpus:
    """A :class:`Corpus` over arrays in memory (token ids and sorted sentence-start positions)."""

    def __init__(self, ids: np.ndarray, starts: np.ndarray) -> None:
        self._ids, self._starts = ids, starts

    @classmethod
    def from_sentence_ids(cls, ids: np.ndarray, sentence_ids: np.ndarray) -> ArrayCorpus:
        """Starts are where the sentence id changes, and position 0."""
        changes = np.flatnonzero(sentence_ids[1:] != sentence_ids[:-1]) + 1
        starts = np.concatenate([[0], changes]) if len(ids) else changes
        return cls(ids, starts.astype(np.int64))

    def __len__(self) -> int:
        return int(self._ids.shape[0])

    def ids(self, begin: int, end: int) -> np.ndarray:
        return np.asarray(self._ids[begin:end], dtype=np.int64)

    def count_starts(self, position: int, side: Side) -> int:
        return int(np.searchsorted(self._starts, position, side=side))

    def start_at(self, index: int) -> int:
        return int(self._starts[index])

    def max_id(self) -> int:
        return int(self._ids.max()) if len(self._ids) else -1


class Row:
    """Stream ``[start, start + length)`` of a corpus, forward or reversed; ``row[a:b]`` reads it."""

    def __init__(self, corpus: Corpus, start: int, length: int, reverse: bool = False) -> None:
        self.corpus, self.start, self.length, self.reverse = corpus, start, length, reverse

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, window: slice) -> np.ndarray:
        a, b, step = window.indices(self.length)
        if step != 1:
            raise ValueError("rows are read in contiguous slices")
        b = max(a, b)
        if not self.reverse:
            return self.corpus.ids(self.start + a, self.start + b)
        end = self.start + self.length
        return self.corpus.ids(end - b, end - a)[::-1]

    def to_array(self) -> np.ndarray:
        """The whole row (tests and small corpora only: a real stream does not fit in memory)."""
        return self[0 : self.length]


class RowBoundaries:
    """Positions inside a :class:`Row` where a new sentence starts (position 0 excluded), sorted, looked
    up lazily: ``len``, ``search(x, side)`` (as ``np.searchsorted``) and ``at(k)``."""

    def __init__(self, row: Row) -> None:
        corpus, start, end = row.corpus, row.start, row.start + row.length
        self.row = row
        self._lo = corpus.count_starts(start, "right")  # starts strictly inside (start, end)
        self._n = max(0, corpus.count_starts(end, "left") - self._lo)

    def __len__(self) -> int:
        return self._n

    def _forward_search(self, x: int, side: Side) -> int:
        found = self.row.corpus.count_starts(self.row.start + x, side) - self._lo
        return min(max(found, 0), self._n)

    def _forward_at(self, k: int) -> int:
        return self.row.corpus.start_at(self._lo + k) - self.row.start

    def search(self, x: int, side: Side = "left") -> int:
        if not self.row.reverse:
            return self._forward_search(x, side)
        # reversed boundary L - q for each forward boundary q: L - q < x  <=>  q > L - x
        flipped: Side = "right" if side == "left" else "left"
        return self._n - self._forward_search(self.row.length - x, flipped)

    def at(self, k: int) -> int:
        if not 0 <= k < self._n:
            raise IndexError(f"boundary {k} of {self._n}")
        if not self.row.reverse:
            return self._forward_at(k)
        return self.row.length - self._forward_at(self._n - 1 - k)

    def to_array(self) -> np.ndarray:
        return np.asarray([self.at(k) for k in range(self._n)], dtype=np.int64)


class ArrayBoundaries:
    """:class:`RowBoundaries`' interface over a sorted array (tests, and rows built in memory)."""

    def __init__(self, positions: np.ndarray) -> None:
        self.positions = np.asarray(positions)

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def search(self, x: int, side: Side = "left") -> int:
        return int(np.searchsorted(self.positions, x, side=side))

    def at(self, k: int) -> int:
        return int(self.positions[k])

    def to_array(self) -> np.ndarray:
        return self.positions


Boundaries = RowBoundaries | ArrayBoundaries
