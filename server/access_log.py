"""The access log: one JSON line per HTTP request on the ``server.access`` logger.

Fields: ``request_id``, ``key`` (the API key's name, never the key), ``client`` (address), ``method``,
``route`` (the route template, never the raw path: no query strings, nothing a caller typed),
``status``, ``windows`` (model inputs the request cost; 0 when it never reached the model) and
``latency_ms``. Questions and contexts are never logged, nor any header.
"""

from __future__ import annotations

import json
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.guard import caller_name
from server.request_ids import request_id_var

access_logger = logging.getLogger("server.access")


class AccessLogMiddleware:
    """Pure ASGI: writes the line once the response has been sent (or the handler failed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            state = scope.get("state") or {}
            access_logger.info(
                json.dumps(
                    {
                        "request_id": request_id_var.get(),
                        "key": caller_name(scope),
                        "client": (scope.get("client") or ("-", 0))[0],
                        "method": scope.get("method", ""),
                        "route": route,
                        "status": status,
                        "windows": int(state.get("windows", 0)),
                        "latency_ms": round((time.perf_counter() - start) * 1000, 3),
                    },
                    separators=(",", ":"),
                )
            )
