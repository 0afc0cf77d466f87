"""The server's view of the API bodies: the shared definitions (``clients.schema``, also the SDK's) plus
the batch model that carries this server's item limit.
"""

from __future__ import annotations

from pydantic import Field, create_model

from clients.schema import (
    MAX_TOP_K,
    AnswerRequest,
    AnswerResponse,
    BatchRequest,
    BatchResponse,
    ErrorResponse,
    HealthResponse,
    ModelInfoResponse,
    NBestEntry,
    Timing,
)

__all__ = [
    "MAX_TOP_K",
    "AnswerRequest",
    "AnswerResponse",
    "BatchRequest",
    "BatchResponse",
    "ErrorResponse",
    "HealthResponse",
    "ModelInfoResponse",
    "NBestEntry",
    "Timing",
    "batch_request_model",
]


def batch_request_model(max_items: int) -> type[BatchRequest]:
    """BatchRequest with the server's item limit in the schema: validation stops at the first item too
    many (one error, not one per item of a huge list) and the route answers 413."""
    return create_model(
        "BatchRequest",
        __base__=BatchRequest,
        __doc__=BatchRequest.__doc__,
        items=(
            list[AnswerRequest],
            Field(min_length=1, max_length=max_items, description=f"At most {max_items} items"),
        ),
    )
