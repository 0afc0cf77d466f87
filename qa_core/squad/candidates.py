"""A decoded question's candidate spans, each an :class:`NBestEntry`: what decoding produces, the
re-ranker reorders and a prediction keeps. A module of its own, below all three, so that none of them
imports another to name it."""

from __future__ import annotations

from dataclasses import dataclass


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
