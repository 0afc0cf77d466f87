"""The (batch, length) shapes a shape-specialised runner (CUDA graphs) prepares ahead, and which one a
padded batch runs in. Plain Python: no torch, testable anywhere.

A CUDA graph replays fixed shapes, so every batch the server forms must fit a prepared shape: batch
sizes are the powers of two up to ``max_batch_size`` (and it), lengths the multiples of a step up to
``max_seq_len`` (and it). The step is ``--pad-multiple-of`` when set (the server already pads to it,
so no batch pays twice), else :data:`DEFAULT_LENGTH_STEP`; it grows when that would make more than
:data:`MAX_LENGTHS` lengths, since every bucket is a captured graph held in GPU memory. A batch runs in
the smallest bucket that holds it; one larger than every bucket has none (the runner runs it eagerly).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

DEFAULT_LENGTH_STEP = 64
MAX_LENGTHS = 16


@dataclass(frozen=True, order=True)
class Bucket:
    """One prepared shape: ``batch`` rows of ``length`` tokens."""

    batch: int
    length: int

    @property
    def tokens(self) -> int:
        return self.batch * self.length


@dataclass(frozen=True)
class BucketGrid:
    """Ascending batch sizes and lengths; their product is the set of buckets."""

    batch_sizes: tuple[int, ...]
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        for name, values in (("batch sizes", self.batch_sizes), ("lengths", self.lengths)):
            if not values or any(v < 1 for v in values) or list(values) != sorted(set(values)):
                raise ValueError(f"bucket {name} must be positive and strictly ascending, got {values}")

    @classmethod
    def for_server(
        cls, max_batch_size: int, max_seq_len: int, pad_multiple_of: int | None = None, min_length: int = 1
    ) -> BucketGrid:
        """The buckets that cover every batch a server with these settings forms."""
        if max_batch_size < 1 or max_seq_len < 1:
            raise ValueError(
                f"max_batch_size and max_seq_len must be positive, got {max_batch_size}, {max_seq_len}"
            )
        batch_sizes = sorted({*(2**i for i in range(max_batch_size.bit_length())), max_batch_size})
        unit = pad_multiple_of or 1
        step = pad_multiple_of or DEFAULT_LENGTH_STEP
        if (
            ceil_div(max_seq_len, step) > MAX_LENGTHS
        ):  # fewer, coarser lengths, still multiples of the padding
            step = ceil_div(ceil_div(max_seq_len, MAX_LENGTHS), unit) * unit
        first = ceil_div(min(min_length, max_seq_len), step) * step
        lengths = sorted({*range(first, max_seq_len, step), max_seq_len})
        return cls(tuple(batch_sizes), tuple(lengths))

    @property
    def largest(self) -> Bucket:
        return Bucket(self.batch_sizes[-1], self.lengths[-1])

    def choose(self, batch: int, length: int) -> Bucket | None:
        """The smallest bucket holding ``batch`` rows of ``length`` tokens; None when none does."""
        if batch < 1 or length < 1:
            raise ValueError(f"a batch needs rows and tokens, got {batch}x{length}")
        b = bisect.bisect_left(self.batch_sizes, batch)
        t = bisect.bisect_left(self.lengths, length)
        if b == len(self.batch_sizes) or t == len(self.lengths):
            return None
        return Bucket(self.batch_sizes[b], self.lengths[t])

    def buckets(self) -> list[Bucket]:
        """Every bucket, most tokens first (the order to capture in, so smaller graphs reuse the memory
        pool the larger ones grew)."""
        every = [Bucket(b, t) for b in self.batch_sizes for t in self.lengths]
        return sorted(every, key=lambda k: (k.tokens, k.batch), reverse=True)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
