"""Requests whose framing is ambiguous, and connections that are not HTTP requests, never reach the app.

A request with both ``Content-Length`` and ``Transfer-Encoding`` can be read two ways, and a proxy in
front that reads it the other way lets the bytes after it run as a second request (smuggling): RFC
9112 section 6.1 says to refuse it and close the connection, so it gets 400 ``bad_framing`` and
``Connection: close`` (uvicorn then closes, and whatever followed on the connection is never parsed).

Every scope but ``http`` and ``lifespan`` (a WebSocket, or whatever a later server adds) is refused
here, before the door: the door, the Host check and the limits are written for HTTP requests, so a
WebSocket route added later would otherwise be open. ``python -m server`` also runs uvicorn with
``ws="none"``, so an upgrade request is a plain GET that the door answers.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.errors import error_response
from server.observability.metrics import Metrics

PASSED_SCOPES = frozenset({"http", "lifespan"})
POLICY_VIOLATION = 1008  # WebSocket close code


class FramingMiddleware:
    """400 + close for Content-Length with Transfer-Encoding; refuses every non-HTTP scope."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in PASSED_SCOPES:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            return
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope.get("headers") or []}
            if b"content-length" in names and b"transfer-encoding" in names:
                response = error_response(
                    self.metrics, 400, "bad_framing",
                    "a request may have Content-Length or Transfer-Encoding, not both",
                    headers={"Connection": "close"},
                )  # fmt: skip
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
