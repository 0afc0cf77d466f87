"""The request body's limits: 413 (JSON) for a body over the size limit, at once from Content-Length or
while chunks arrive, and 408 for a body that does not arrive in time; a refused body is read briefly
and discarded so the client, still uploading, receives the answer instead of a connection reset."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.answering.deadline import within
from server.api.errors import error_response
from server.observability.metrics import Metrics


class BodyTooSlow(StarletteHTTPException):
    """Raised from ``receive`` when the body has not arrived within ``body_timeout_s``."""

    def __init__(self) -> None:
        super().__init__(408, "request body too slow")


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` when a streamed (chunked) body passes the limit; FastAPI re-raises it."""

    def __init__(self) -> None:
        super().__init__(413, "request body too large")


LINGER_BYTES = 64 * 1024 * 1024  # an oversized body up to this size is read and discarded before the 413
LINGER_S = 2.0  # ... for at most this long


async def discard_body(receive: Receive, seconds: float) -> None:
    """Read the rest of a refused body (bounded in time), so the client, still uploading, receives the
    413 instead of a connection reset when the server closes with unread data."""

    async def drain() -> None:
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(drain(), seconds)


class BodyLimitMiddleware:
    """413 (JSON) for bodies over ``max_bytes``: at once from Content-Length, else while reading chunks.

    Starlette's own limiter answers in plain text; this keeps every error in the API's JSON shape.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: Metrics, timeout_s: float = 30.0) -> None:
        self.app, self.max_bytes, self.metrics, self.timeout_s = app, max_bytes, metrics, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(
                self.metrics, 413, "body_too_large", f"request body exceeds {self.max_bytes} bytes (max_body_bytes)",
                headers={"Connection": "close"},
            )  # fmt: skip
            expects_continue = headers.get(b"expect", b"").lower() == b"100-continue"
            if int(declared) <= LINGER_BYTES and not expects_continue:  # reading would invite the upload
                await discard_body(receive, LINGER_S)
            await response(scope, receive, send)
            return
        seen, body_done = 0, False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def limited() -> Message:
            # Only the body is timed and counted: once it is complete, later receives (a handler
            # waiting for the client's disconnect while its answer is computed) pass straight through.
            nonlocal seen, body_done
            if body_done:
                return await receive()
            try:
                message = await within(receive(), deadline)
            except asyncio.TimeoutError:
                raise BodyTooSlow() from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, limited, send)
