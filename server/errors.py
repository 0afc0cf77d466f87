"""Every error the API returns is JSON ``{"error": kind, "message": text}`` (+ ``details`` for 422).

Status codes: 400 body not JSON / not UTF-8; 413 context, question, batch or body over the limits;
415 Content-Type not JSON; 422 wrong types, unknown fields, empty question, out-of-range values;
500 the backend call holding the request failed; 503 (+ Retry-After) not ready, overloaded or
shutting down; 504 no answer within ``request_timeout_s``. Framework errors (404, 405, FastAPI's
validation and body-parsing errors) are translated here into the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.metrics import Metrics
from server.schemas import ErrorResponse
from server.settings import ServerSettings

logger = logging.getLogger("server")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Body is not valid JSON or not UTF-8"},
    413: {
        "model": ErrorResponse,
        "description": "Context/question/body/batch larger than the server's limits",
    },
    415: {"model": ErrorResponse, "description": "Content-Type is not application/json"},
    422: {
        "model": ErrorResponse,
        "description": "Wrong types, unknown fields, empty question, out-of-range values",
    },
    500: {"model": ErrorResponse, "description": "The backend call holding this request failed"},
    503: {
        "model": ErrorResponse,
        "description": "Not ready yet, queue full or shutting down (see Retry-After)",
    },
    504: {"model": ErrorResponse, "description": "No answer within request_timeout_s"},
}


class ApiError(Exception):
    """An error response raised from a route: status, kind and message (+ headers)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` when a streamed (chunked) body passes the limit; FastAPI re-raises it."""

    def __init__(self) -> None:
        super().__init__(413, "request body too large")


class BodyLimitMiddleware:
    """413 (JSON) for bodies over ``max_bytes``: at once from Content-Length, else while reading chunks.

    Starlette's own limiter answers in plain text; this keeps every error in the API's JSON shape.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: Metrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(
                self.metrics, 413, "body_too_large", f"request body exceeds {self.max_bytes} bytes",
                headers={"Connection": "close"},
            )  # fmt: skip
            await response(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            return message

        await self.app(scope, limited, send)


def error_response(metrics: Metrics, status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    metrics.errors.labels(kind).inc()
    headers = extra.pop("headers", None)
    body = ErrorResponse(error=kind, message=message, **extra).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


def _msg(error: dict[str, Any]) -> str:
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def _validation_message(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {_msg(e)}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def install_error_handlers(app: FastAPI, metrics: Metrics, settings: ServerSettings) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(metrics, exc.status, exc.kind, exc.message, headers=exc.headers)

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
                f"Content-Type must be application/json, got {content_type!r}",
            )
        details = [{"loc": list(e.get("loc", ())), "msg": _msg(e), "type": e.get("type")} for e in errors]
        return error_response(metrics, 422, "validation_error", _validation_message(errors), details=details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
            message = f"request body is not valid UTF-8 ({cause.reason} at byte {cause.start})"
            return error_response(metrics, 400, "invalid_utf8", message)
        if exc.status_code == 413:
            return error_response(
                metrics, 413, "body_too_large", f"request body exceeds {settings.max_body_bytes} bytes"
            )
        kinds = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}
        return error_response(
            metrics,
            exc.status_code,
            kinds.get(exc.status_code, "http_error"),
            str(exc.detail),
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(metrics, 500, "internal_error", f"internal error: {type(exc).__name__}")
