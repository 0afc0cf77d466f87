"""The access log: one line per HTTP request on the ``server.access`` logger, its fields structured
(:mod:`server.observability.log_format` writes them as ``key=value`` or as JSON fields). Probes that succeed are not
logged (a kubelet asks every few seconds); a failing probe is.

Fields: the request id (every line has it), ``key`` (the API key's name, never the key), ``client`` (address), ``method`` (GET, POST, HEAD, OPTIONS or ``other``),
``route`` (the route template, never the raw path: no query strings, nothing a caller typed),
``status``, ``windows`` (model inputs the request cost; 0 when it never reached the model) and
``latency_ms``. Questions and contexts are never logged, nor any header.
"""

from __future__ import annotations

import logging

from starlette.types import Scope

from server.door.key_check import PROBES, caller_name
from server.observability.log_format import FIELDS
from server.observability.observe import ObservingMiddleware, method_label, route_label

access_logger = logging.getLogger("server.access")


class AccessLogMiddleware(ObservingMiddleware):
    """Writes the line once the response has been sent (or the handler failed)."""

    def finished(self, scope: Scope, status: int, seconds: float) -> None:
        if scope.get("path") in PROBES and status < 400:
            return
        state = scope.get("state") or {}
        line = {
            "key": caller_name(scope),
            "client": (scope.get("client") or ("-", 0))[0],
            "method": method_label(scope),
            "route": route_label(scope),
            "status": status,
            "windows": int(state.get("windows", 0)),
            "latency_ms": round(seconds * 1000, 3),
        }
        access_logger.info("request", extra={FIELDS: line})
