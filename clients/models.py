"""The SDK's typed results and request item: the shared API schema (``clients.schema``, also what the
server validates and documents), with the conveniences an SDK adds (frozen results, ``n_best`` always a
list, ``has_answer``). Nothing here may add, drop or retype a field: ``tests/test_client.py`` checks."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from clients.schema import AnswerRequest, AnswerResponse, ModelInfoResponse, NBestEntry, Timing

__all__ = ["Answer", "ModelInfo", "NBestEntry", "QARequest", "Timing", "request_payload"]

QARequest = AnswerRequest  # one item of answer_batch (plain dicts and (question, context) pairs work too)


def request_payload(item: AnswerRequest) -> dict[str, Any]:
    """Only the fields the caller set, so the server's (the model's) defaults apply to the others."""
    return item.payload()


class Answer(AnswerResponse):
    """The answer to one question, with character offsets into the context that was sent.

    Unanswerable (``is_impossible``): ``answer == ""`` and ``start == end == -1``. ``n_best`` is the
    list of candidates when ``top_k > 1`` was asked, else empty (the server omits it).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    n_best: list[NBestEntry] = Field(default_factory=list)

    @field_validator("n_best", mode="before")
    @classmethod
    def _absent_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value

    @property
    def has_answer(self) -> bool:
        return not self.is_impossible


class ModelInfo(ModelInfoResponse):
    """``GET /v1/model``: what the server runs and its limits."""

    model_config = ConfigDict(extra="allow", frozen=True)
