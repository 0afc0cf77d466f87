"""A decoded question's candidate spans, each an :class:`NBestEntry`: what decoding produces, the
re-ranker reorders and a prediction keeps. A module of its own, below all three, so that none of them
imports another to name it."""

from __future__ import annotations

from dataclasses import dataclass

TOP_K = 10  # the spans the re-ranker rescores, and the mass a span's share is taken over


@dataclass
class NBestEntry:
    """One candidate span: text and character offsets in the context, plus where it came from."""

    text: str
    start: int
    end: int
    score: float
    probability: float
    start_log_prob: float
    end_log_prob: float
    window_index: int
    start_token: int
    end_token: int
    # [word_start, word_end): the span widened to whole words, at most max_answer_len tokens in all
    # (alignment.word_extent; the span itself when widening would pass it); -1: not computed
    word_start: int = -1
    word_end: int = -1
    # its share of the probability mass of the first TOP_K spans as decoded (exactly the best TOP_K):
    # what the re-ranker and the answerability rule read, the same for any n-best list of TOP_K or more
    share: float = 0.0
