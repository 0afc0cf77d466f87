"""The HTTP API's request and response bodies: one definition for the server (validation, OpenAPI)
and the SDK (arguments checked before sending, typed results). pydantic only, nothing else of ours.

Requests are strict (no type coercion, no unknown fields): a typo such as ``max_answer_length`` or a
``top_k`` of ``"3"`` is a 422 with a message (in the SDK: an error before anything is sent), not a
silently different request. Size limits that depend on server settings (context/question characters,
batch items) are checked by the server and answered with 413, so they are documented in the
descriptions rather than the schema. Responses ignore unknown fields, so an older SDK reads a newer
server's answers.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOP_K = 20


class AnswerRequest(BaseModel):
    """One question about one context."""

    model_config = ConfigDict(strict=True, extra="forbid")

    # The pattern documents the rule for clients and fuzzers; the validators below enforce it with a
    # clearer message, and the server answers 422 for text that has no tokens after normalisation.
    question: str = Field(
        description="The question; must contain a non-whitespace character and at least one token",
        json_schema_extra={"minLength": 1, "pattern": r"\S"},
    )
    context: str = Field(
        description="The text to answer from; must contain at least one token",
        json_schema_extra={"minLength": 1, "pattern": r"\S"},
    )
    top_k: int = Field(1, ge=1, le=MAX_TOP_K, description="n_best entries to return (only when > 1)")
    max_answer_len: int | None = Field(
        None, ge=1, le=512, description="Longest answer in tokens (default: the model's, usually 30)"
    )
    threshold: float | None = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False, description="No-answer threshold (default: the model's)"
    )

    def payload(self) -> dict[str, Any]:
        """The JSON body with only the fields that were set, so the server's defaults apply to the rest."""
        return self.model_dump(exclude_unset=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """Unknown fields are one error naming a few of them, however many were sent (pydantic's own
        check costs one error per field, and a body of a million of them would take seconds)."""
        if isinstance(data, dict):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                shown = ", ".join(repr(str(k)[:40]) for k in unknown[:3])
                more = f" (+{len(unknown) - 3} more)" if len(unknown) > 3 else ""
                raise ValueError(f"unknown field(s) {shown}{more}; allowed: {', '.join(cls.model_fields)}")
        return data

    @field_validator("top_k", "max_answer_len", mode="before")
    @classmethod
    def _whole_numbers(cls, value: Any) -> Any:
        """JSON Schema counts 3.0 as an integer; strict mode would not. Strings and booleans stay errors."""
        return int(value) if type(value) is float and value.is_integer() else value

    @field_validator("question", "context")
    @classmethod
    def _valid_unicode(cls, value: str) -> str:
        """JSON allows escaped lone surrogates ("\\ud800"); they cannot be tokenized or sent back as UTF-8."""
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"text contains an unpaired surrogate at position {exc.start}") from None
        return value

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("question must not be empty or whitespace")
        return value


class BatchRequest(BaseModel):
    """Several questions answered in one call; results come back in the same order."""

    model_config = ConfigDict(strict=True, extra="forbid")

    items: list[AnswerRequest] = Field(min_length=1, description="At most max_batch_items (setting) items")


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NBestEntry(_Response):
    """A candidate span: ``context[start:end] == text``."""

    text: str
    start: int
    end: int
    score: float = Field(description="The reader's log-probability of the span: its start's plus its end's")
    probability: float = Field(
        description="The span's share of the probability mass of the reader's 10 best spans, the same "
        "whatever the request's top_k or the server's --n-best-pool when the server keeps 10 or more (the "
        "default for a model that does; a smaller pool measures against its own spans). A span past the "
        "10th is measured against the same mass; spans that snap to the same words are listed once, with "
        "the first one's share"
    )


class Timing(_Response):
    """Milliseconds spent in each stage; ``total`` is the whole request (shared by a batch's items)."""

    featurize: float
    queue: float
    inference: float
    decode: float
    total: float


class AnswerResponse(_Response):
    """The answer with character offsets into the request's context: ``context[start:end] == answer``.

    ``answerable_prob`` is the model's P(answerable) (calibrated when the model carries a fitted
    answerability model) and ``no_answer_prob`` its complement; the question is judged unanswerable
    when ``no_answer_prob > threshold`` (the threshold this question was decided at: the request's,
    the server's, or the model's rule; under the expected-gain rule it depends on how good the span
    looks), or when no span is valid. ``rule`` says what set ``threshold``: ``request`` (the request's
    own), ``server`` (its ``--no-answer-threshold``), or the model's rule: ``cls`` (its <cls> score
    against a threshold), ``threshold`` or ``expected_gain`` (a fitted answerability model), ``none``
    (a fitted model that did not beat answering none: it answers nothing). Unanswerable: ``answer``
    is "" and ``start == end == -1``, but ``best_span`` still says what the model would have
    answered. ``reason`` says in one line what the rule weighed (P(no answer) against the threshold,
    or P(answerable) x the span's expected F1 against P(no answer) under expected gain), ``margin`` by
    how much, and ``expected_f1`` the expected-gain rule's input. ``score`` (log-probability of the
    best span) is null only when the context has no valid span at all. ``n_best`` is present only when
    ``top_k > 1``.
    """

    answer: str
    start: int
    end: int
    score: float | None
    no_answer_prob: float
    answerable_prob: float | None = None  # None only from servers older than this field
    threshold: float | None = None
    rule: str | None = None  # None only from servers older than this field
    reason: str | None = None  # why it answered or abstained, from the rule's inputs (None: older servers)
    margin: float | None = None  # threshold - no_answer_prob: > 0 answered by that much, < 0 declined
    expected_f1: float | None = None  # the expected-gain rule's E[F1 of the best span]; None: another rule
    is_impossible: bool
    best_span: NBestEntry | None = None
    n_best: list[NBestEntry] | None = None
    model: str
    timing_ms: Timing


class BatchResponse(_Response):
    results: list[AnswerResponse]


class ErrorResponse(_Response):
    """Every error: a machine-readable ``error`` kind, a human-readable ``message`` and the request id
    (also the ``X-Request-ID`` header) under which the server logged it. 422 lists at most five
    ``details`` and counts the rest in ``details_omitted``."""

    error: str
    message: str
    request_id: str
    details: list[dict[str, Any]] | None = None
    details_omitted: int | None = None


class HealthResponse(_Response):
    """``status``: starting, loading, warming, ready, stopping, unhealthy or failed. ``/readyz`` also
    says what the model really runs on: ``providers`` (onnxruntime, in onnxruntime's order) or
    ``device`` (TensorRT, torch), read back from the loaded runtime, not from the flags."""

    status: str
    providers: list[str] | None = None
    device: str | None = None


class ModelInfoResponse(BaseModel):
    """What is being served (from the export sidecar or checkpoint metadata) and how."""

    model_config = ConfigDict(extra="allow")

    name: str
    backend: str
    head: str
    precision: str
    max_seq_len: int
    doc_stride: int
    max_query_len: int
    max_answer_len: int
    n_best: int | None = None  # candidates per window when decoding (servers before it did not say)
    no_answer_threshold: float
    answerability: dict[str, Any] | None = None
    ready: bool
    runtime: dict[str, Any]
    limits: dict[str, Any]
    batching: dict[str, Any]
