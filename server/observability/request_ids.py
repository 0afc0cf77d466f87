"""Request ids: one per HTTP request, in the ``X-Request-ID`` response header, in error bodies and in
every log line written while the request is handled, so a client's report finds the server's traceback.

A client's own ``X-Request-ID`` is kept when it is a short token (letters, digits, ``._:-``, at most 64),
so ids can follow a request across services; anything else is replaced by a generated one.
"""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar

from starlette.datastructures import MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from server.door.http_middleware import HttpMiddleware

REQUEST_ID_HEADER = "X-Request-ID"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
request_id_var: ContextVar[str] = ContextVar("request_id", default="-")


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` (the request being handled, or "-") to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class RequestIdMiddleware(HttpMiddleware):
    """Gives every request an id: in the log context, in error bodies and in the X-Request-ID header."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = dict(scope.get("headers") or []).get(REQUEST_ID_HEADER.lower().encode(), b"")
        given_text = given.decode("latin-1")
        request_id = given_text if _CLIENT_ID.fullmatch(given_text) else uuid.uuid4().hex
        request_id_var.set(request_id)  # each request runs in its own task, hence its own context

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if REQUEST_ID_HEADER not in headers:
                    headers.append(REQUEST_ID_HEADER, request_id)
            await send(message)

        await self.app(scope, receive, send_with_id)
