"""Typed results of the XLNet QA HTTP API (pydantic; unknown fields from newer servers are ignored)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Result(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NBestEntry(_Result):
    """A candidate span: ``context[start:end] == text``."""

    text: str
    start: int
    end: int
    score: float
    probability: float


class Timing(_Result):
    """Server-side milliseconds per stage."""

    featurize: float = 0.0
    queue: float = 0.0
    inference: float = 0.0
    decode: float = 0.0
    total: float = 0.0


class Answer(_Result):
    """The answer to one question, with character offsets into the context that was sent.

    Unanswerable (``is_impossible``): ``answer == ""`` and ``start == end == -1``.
    """

    answer: str
    start: int
    end: int
    score: float | None = None
    no_answer_prob: float
    is_impossible: bool
    n_best: list[NBestEntry] = Field(default_factory=list)
    model: str = ""
    timing_ms: Timing = Field(default_factory=Timing)

    @property
    def has_answer(self) -> bool:
        return not self.is_impossible


class QARequest(BaseModel):
    """One item of :meth:`XLNetQAClient.answer_batch` (plain dicts with these keys work too)."""

    model_config = ConfigDict(extra="forbid")

    question: str
    context: str
    top_k: int | None = None
    max_answer_len: int | None = None  # None: the served model's own setting
    threshold: float | None = Field(None, allow_inf_nan=False)

    def payload(self) -> dict[str, Any]:
        """Only the fields that were set, so the server's defaults apply to the others."""
        return self.model_dump(exclude_none=True)


class ModelInfo(_Result):
    """``GET /v1/model``: what the server runs and its limits."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    backend: str
    head: str
    precision: str
    max_seq_len: int
    doc_stride: int
    max_query_len: int
    max_answer_len: int
    no_answer_threshold: float
    ready: bool = False
    runtime: dict[str, Any] = Field(default_factory=dict)
    limits: dict[str, Any] = Field(default_factory=dict)
    batching: dict[str, Any] = Field(default_factory=dict)
