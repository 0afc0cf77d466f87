"""The access log: one JSON line per HTTP request on the ``server.access`` logger.

Fields: ``request_id``, ``key`` (the API key's name, never the key), ``client`` (address), ``method`` (GET, POST, HEAD, OPTIONS or ``other``),
``route`` (the route template, never the raw path: no query strings, nothing a caller typed),
``status``, ``windows`` (model inputs the request cost; 0 when it never reached the model) and
``latency_ms``. Questions and contexts are never logged, nor any header.
"""

from __future__ import annotations

import json
import logging

from starlette.types import Scope

from server.door import caller_name
from server.observe import ObservingMiddleware, method_label, route_label
from server.request_ids import request_id_var

access_logger = logging.getLogger("server.access")


class AccessLogMiddleware(ObservingMiddleware):
    """Writes the line once the response has been sent (or the handler failed)."""

    def finished(self, scope: Scope, status: int, seconds: float) -> None:
        state = scope.get("state") or {}
        line = {
            "request_id": request_id_var.get(),
            "key": caller_name(scope),
            "client": (scope.get("client") or ("-", 0))[0],
            "method": method_label(scope),
            "route": route_label(scope),
            "status": status,
            "windows": int(state.get("windows", 0)),
            "latency_ms": round(seconds * 1000, 3),
        }
        access_logger.info(json.dumps(line, separators=(",", ":")))
