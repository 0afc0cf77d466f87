"""Watching HTTP requests from outside the app: a pure ASGI middleware that sees each request's
status and duration, whatever the handler did (errors included). Metrics and the access log are
both built on it, and both name a request by the labels here, each from a fixed set: the method
(:data:`KNOWN_METHODS` or ``other``) and the route template (or ``unmatched``)."""

from __future__ import annotations

import time

from starlette.types import Message, Receive, Scope, Send

from server.door.http_middleware import HttpMiddleware

KNOWN_METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS"})
OTHER_METHOD = "other"

# The request state's entry where the door (server.door.key_check) records the caller's key name, which the
# routes, the per-key metrics and the access log read (never the key itself).
KEY_NAME = "key_name"


def route_label(scope: Scope) -> str:
    """The matched route's template (never the raw path, so random URLs cannot add label values)."""
    return getattr(scope.get("route"), "path", None) or "unmatched"


def method_label(scope: Scope) -> str:
    """The method if it is one the API uses, else ``other``: HTTP lets a client invent any method (of
    any length), and each raw one would be a new label value, a new series and a longer log line."""
    method = scope.get("method", "")
    return method if method in KNOWN_METHODS else OTHER_METHOD


class ObservingMiddleware(HttpMiddleware):
    """Calls :meth:`started` before an HTTP request and :meth:`finished` after it (always)."""

    def started(self, scope: Scope) -> None:
        """Before the app runs (default: nothing)."""

    def finished(self, scope: Scope, status: int, seconds: float) -> None:
        """After the response, or the failure (status 500 when none was sent)."""
        raise NotImplementedError

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 500
        start = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.started(scope)
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.finished(scope, status, time.perf_counter() - start)
