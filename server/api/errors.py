"""Every error the API returns is JSON ``{"error": kind, "message": text, "request_id": id}`` (+
``details`` for 422).

Status codes: 400 body not JSON / not UTF-8; 413 over a size or work limit; 415 Content-Type not JSON;
422 wrong types, unknown fields, a question or context without tokens, out-of-range values; 500 the
backend call holding the request failed or gave a non-finite output; 503 (+ Retry-After) not ready,
unhealthy, overloaded or shutting down; 504 no answer within ``request_timeout_s``. Framework errors
(404, 405, FastAPI's validation and body-parsing errors) are translated here into the same shape.

Bodies are bounded: at most ``MAX_DETAILS`` validation entries (each cut to ``MAX_TEXT`` characters)
plus the count of the rest, so an error is never much larger than the request that caused it.
Exception text and file paths go to the log under the request id (:mod:`server.observability.request_ids`), never
to the client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.api.api_error import ApiError
from server.api.schemas import ErrorResponse
from server.limits.quotas import OverLimit
from server.observability.metrics import Metrics
from server.observability.request_ids import REQUEST_ID_HEADER, request_id_var
from server.settings import ServerSettings
from server.topology.engine.failures import EngineUnavailable

logger = logging.getLogger("server")

MAX_DETAILS = 5
MAX_TEXT = 200


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Body is not valid JSON or not UTF-8"},
    401: {"model": ErrorResponse, "description": "No valid API key (WWW-Authenticate: Bearer)"},
    413: {
        "model": ErrorResponse,
        "description": "Context/question/body/batch larger than the server's limits",
    },
    415: {"model": ErrorResponse, "description": "Content-Type is not application/json"},
    422: {
        "model": ErrorResponse,
        "description": "Wrong types, unknown fields, empty question, out-of-range values",
    },
    429: {
        "model": ErrorResponse,
        "description": "This key is over a rate, window or daily limit, or this address over its failed "
        "authentications (see Retry-After)",
    },
    500: {"model": ErrorResponse, "description": "The backend call holding this request failed"},
    503: {
        "model": ErrorResponse,
        "description": "Not ready yet, overloaded (queue full), shutting down, or the engine process restarting "
        "(see Retry-After)",
    },
    504: {"model": ErrorResponse, "description": "No answer within request_timeout_s"},
}


def rate_limited_response(metrics: Metrics, exc: OverLimit, close: bool = False) -> JSONResponse:
    """429 ``rate_limited`` + Retry-After for a caller over one of its limits, counted by key name and
    limit; the door (request rate, quota; ``close``: its body may be unread) and the routes (windows)
    both answer with it."""
    metrics.rate_limited.labels(exc.caller, exc.limit).inc()
    headers = {"Retry-After": str(exc.retry_after)} | ({"Connection": "close"} if close else {})
    return error_response(metrics, 429, "rate_limited", exc.message, headers=headers)


def engine_unavailable_response(metrics: Metrics, exc: Exception, retry_after_s: int) -> JSONResponse:
    """503 ``engine_unavailable`` + Retry-After: the engine process is away (killed, restarting, hung);
    the door (per-key limits live there) and the routes both answer with it."""
    headers = {"Retry-After": str(retry_after_s), "Connection": "close"}
    return error_response(metrics, 503, "engine_unavailable", str(exc), headers=headers)


def error_response(metrics: Metrics, status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    metrics.errors.labels(kind).inc()
    request_id = request_id_var.get()
    headers = {**(extra.pop("headers", None) or {}), REQUEST_ID_HEADER: request_id}
    body = ErrorResponse(error=kind, message=message, request_id=request_id, **extra)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


def _msg(error: dict[str, Any]) -> str:
    return _cut(str(error.get("msg", "invalid")).removeprefix("Value error, "))


def _loc(error: dict[str, Any]) -> str:
    return _cut(".".join(str(x) for x in error.get("loc", ()) if x != "body") or "body", 100)


def _validation_message(errors: list[dict[str, Any]]) -> str:
    parts = [f"{_loc(e)}: {_msg(e)}" for e in errors[:MAX_DETAILS]]
    more = f" (+{len(errors) - MAX_DETAILS} more)" if len(errors) > MAX_DETAILS else ""
    return "; ".join(parts) + more


def _details(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "loc": [_cut(str(x), 100) for x in e.get("loc", ())][:10],
            "msg": _msg(e),
            "type": _cut(str(e.get("type"))),
        }
        for e in errors[:MAX_DETAILS]
    ]


def install_error_handlers(app: FastAPI, metrics: Metrics, settings: ServerSettings) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(metrics, exc.status, exc.kind, exc.message, headers=exc.headers)

    @app.exception_handler(OverLimit)
    async def _over_limit(_: Request, exc: OverLimit) -> JSONResponse:
        return rate_limited_response(metrics, exc)

    @app.exception_handler(EngineUnavailable)
    async def _engine_away(_: Request, exc: EngineUnavailable) -> JSONResponse:
        return engine_unavailable_response(metrics, exc, settings.retry_after_s)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", "invalid JSON")
            pos = first.get("loc", (None, None))[-1]
            return error_response(
                metrics, 400, "invalid_json", f"request body is not valid JSON: {detail} at position {pos}"
            )
        content_type = request.headers.get("content-type", "")
        if tuple(first.get("loc", ())) == ("body",) and "json" not in content_type.lower():
            return error_response(
                metrics,
                415,
                "unsupported_media_type",
                f"Content-Type must be application/json, got {_cut(content_type, 100)!r}",
            )
        if first.get("type") == "too_long" and tuple(first.get("loc", ())) == ("body", "items"):
            n = (first.get("ctx") or {}).get("actual_length", "more")
            message = f"the batch has {n} items; the limit is {settings.max_batch_items} (max_batch_items)"
            return error_response(metrics, 413, "too_many_items", message)
        omitted = max(0, len(errors) - MAX_DETAILS) or None
        return error_response(
            metrics, 422, "validation_error", _validation_message(errors),
            details=_details(errors), details_omitted=omitted,
        )  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
            message = f"request body is not valid UTF-8 ({cause.reason} at byte {cause.start})"
            return error_response(metrics, 400, "invalid_utf8", message)
        if exc.status_code == 413:
            return error_response(
                metrics,
                413,
                "body_too_large",
                f"request body exceeds {settings.body_limit} bytes (max_body_bytes)",
            )
        if exc.status_code == 408:
            message = f"the request body did not arrive within {settings.body_timeout_s:g} s"
            return error_response(metrics, 408, "body_timeout", message, headers={"Connection": "close"})
        kinds = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}
        return error_response(
            metrics,
            exc.status_code,
            kinds.get(exc.status_code, "http_error"),
            _cut(str(exc.detail)),
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(metrics, 500, "internal_error", "internal error; see the server log")
