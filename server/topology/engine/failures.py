"""Errors across the wire: the engine names an exception by kind, the front raises the same class, so
the HTTP layer answers a request served by an engine process exactly as one served in-process."""

from __future__ import annotations

from collections.abc import Callable

from server.answering.batching import (
    BackendHung,
    BatcherClosed,
    BatcherUnhealthy,
    InferenceError,
    NonFiniteOutput,
    QueueFull,
)
from server.answering.scheduling import DeadlineUnreachable
from server.limits.quotas import OverLimit


class EngineUnavailable(BatcherUnhealthy):
    """The engine process is gone, restarting, not ready yet, or not answering."""


# Most specific first: a subclass is named before the class it extends.
_KINDS: tuple[tuple[str, type[Exception]], ...] = (
    ("non_finite", NonFiniteOutput),
    ("inference_failed", InferenceError),
    ("hung", BackendHung),
    ("engine_unavailable", EngineUnavailable),
    ("unhealthy", BatcherUnhealthy),
    ("closed", BatcherClosed),
    ("queue_full", QueueFull),
    ("deadline", DeadlineUnreachable),
)


def kind_of(exc: BaseException) -> str:
    """The wire's name for ``exc`` (``internal`` for anything unexpected; OverLimit is its own message)."""
    for kind, cls in _KINDS:
        if isinstance(exc, cls):
            return kind
    return "internal"


def exception_of(
    kind: str, message: str, limit: str | None = None, retry_after: float | None = None, caller: str = ""
) -> Exception:
    """The exception a front raises for a failure the engine reported."""
    if kind == "over_limit":
        return OverLimit(caller, limit or "", retry_after or 1.0, message)
    for name, cls in _KINDS:
        if name == kind:
            maker: Callable[[str], Exception] = cls
            return maker(message)
    return InferenceError(message)
