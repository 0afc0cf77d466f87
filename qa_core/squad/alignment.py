"""Between characters and tokens: tokenizer offsets, an answer's token span, a span's text, and a check
that every gold answer survives the round trip text -> tokens -> text.

Featurisation (:mod:`.features`) labels answers with these and decoding (:mod:`.decode`) maps spans
back with them; :func:`alignment_report` measures how many gold answers a tokenizer keeps exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .data import SquadExample


class TokenizerLike(Protocol):
    """What featurisation needs from :class:`qa_core.tokenizer.XLNetTokenizer`."""

    def encode(self, text: str) -> list[int]: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...


@dataclass(frozen=True)
class AlignmentFailure:
    """An answer whose tokens do not map back to exactly its text."""

    qas_id: str
    answer_text: str
    answer_start: int
    recovered_text: str | None


def offsets_array(offsets: Sequence[tuple[int, int]] | np.ndarray) -> np.ndarray:
    """Tokenizer offsets as an int64 array of shape [n, 2] (also for n == 0).

    ``np.fromiter`` over the flattened pairs is ~3x faster than ``np.asarray`` on a list of tuples,
    which matters on the per-request serving path.
    """
    if isinstance(offsets, np.ndarray):
        return offsets.astype(np.int64, copy=False).reshape(-1, 2)
    flat = itertools.chain.from_iterable(offsets)
    return np.fromiter(flat, dtype=np.int64, count=2 * len(offsets)).reshape(-1, 2)


def align_answer(offsets: np.ndarray, answer_start: int, answer_text: str) -> tuple[int, int] | None:
    """Inclusive token span of an answer: every token whose characters overlap the answer's.

    Leading/trailing whitespace of the answer is ignored, and so are zero-width tokens. None when no
    token overlaps (a whitespace-only answer).
    """
    stripped = answer_text.lstrip()
    a = answer_start + (len(answer_text) - len(stripped))
    b = a + len(stripped.rstrip())
    if b <= a or len(offsets) == 0:
        return None
    starts, ends = offsets[:, 0], offsets[:, 1]
    hit = np.flatnonzero((starts < b) & (ends > a) & (ends > starts))
    if hit.size == 0:
        return None
    return int(hit[0]), int(hit[-1])


def span_text(context: str, token_to_char: np.ndarray, start: int, end: int) -> tuple[str, int, int]:
    """``(text, char_start, char_end)`` of tokens ``start..end``, whitespace trimmed, so that
    ``context[char_start:char_end] == text``."""
    return trimmed(context, int(token_to_char[start, 0]), int(token_to_char[end, 1]))


def trimmed(context: str, a: int, b: int) -> tuple[str, int, int]:
    """``(text, a', b')``: characters ``[a, b)`` of ``context`` without leading or trailing whitespace."""
    raw = context[a:b]
    a += len(raw) - len(raw.lstrip())
    b = max(a, b - (len(raw) - len(raw.rstrip())))
    return context[a:b], a, b


def cuts_a_word(context: str, a: int, b: int) -> bool:
    """Whether ``[a, b)`` begins or ends inside a run of letters and digits (a letter or digit on both
    sides of a boundary). Checked for every n-best span of every question: most cut none."""
    n = len(context)
    return (0 < a < n and context[a - 1].isalnum() and context[a].isalnum()) or (
        0 < b < n and context[b - 1].isalnum() and context[b].isalnum()
    )


def word_extent(
    context: str, token_to_char: np.ndarray, start: int, end: int, first: int, last: int, max_tokens: int
) -> tuple[int, int]:
    """``[a, b)``: the characters of tokens ``start..end`` widened to whole words (a span that begins or
    ends inside a run of letters and digits takes the whole run, as the re-ranker reads spans), taking
    tokens outward within ``first..last`` and never more than ``max_tokens`` tokens in all. Where the
    word goes on past that, the unwidened span is kept: a 12,000-letter word never becomes a
    12,000-character answer, and the walk costs tokens of the span's neighbourhood, not the word."""
    a0, b0 = int(token_to_char[start, 0]), int(token_to_char[end, 1])
    n = len(context)
    if not cuts_a_word(context, a0, b0):
        return a0, b0  # already whole words: most spans
    budget = max_tokens - (end - start + 1)
    a, s = a0, start
    while 0 < a < n and context[a - 1].isalnum() and context[a].isalnum():
        if a > token_to_char[s, 0]:  # the word goes on inside this token
            a -= 1
            continue
        if s <= first or budget <= 0:  # it goes on into a token the span may not take
            return a0, b0
        s, budget = s - 1, budget - 1
        a = int(token_to_char[s, 1])
    b, e = b0, end
    while 0 < b < n and context[b - 1].isalnum() and context[b].isalnum():
        if b < token_to_char[e, 1]:
            b += 1
            continue
        if e >= last or budget <= 0:
            return a0, b0
        e, budget = e + 1, budget - 1
        b = int(token_to_char[e, 0])
    return a, b


class ContextEncoder:
    """Tokenizer calls cached per text, so a paragraph shared by many questions is encoded once."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self.tokenizer = tokenizer
        self._contexts: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def context(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        hit = self._contexts.get(text)
        if hit is None:
            ids, offsets = self.tokenizer.encode_with_offsets(text)
            hit = (np.asarray(ids, dtype=np.int64), offsets_array(offsets))
            self._contexts[text] = hit
        return hit


def answer_survives(context: str, offsets: np.ndarray, answer_text: str, answer_start: int) -> bool:
    """Whether the answer's tokens map back to exactly its text (whitespace trimmed)."""
    span = align_answer(offsets, answer_start, answer_text)
    if span is None:
        return False
    return span_text(context, offsets, span[0], span[1])[0] == answer_text.strip()


def alignment_report(
    examples: Iterable[SquadExample], tokenizer: TokenizerLike
) -> tuple[int, int, list[AlignmentFailure]]:
    """``(n_ok, n_total, failures)`` over every distinct gold answer: text -> tokens -> text exactly."""
    encoder = ContextEncoder(tokenizer)
    n_ok = n_total = 0
    failures: list[AlignmentFailure] = []
    for ex in examples:
        if not ex.answers:
            continue
        _, offsets = encoder.context(ex.context)
        for text, start in dict.fromkeys(ex.answers):
            n_total += 1
            span = align_answer(offsets, start, text)
            recovered = None if span is None else span_text(ex.context, offsets, span[0], span[1])[0]
            if recovered == text.strip():
                n_ok += 1
            else:
                failures.append(AlignmentFailure(ex.qas_id, text, start, recovered))
    return n_ok, n_total, failures
