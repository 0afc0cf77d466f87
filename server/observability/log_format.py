"""How the server's log lines look: one format for every line of a process, ``--log-format``.

``text`` (the default, for a terminal): ``time LEVEL logger [request id] message``, and a structured
record's fields (the access log's) after the message as ``key=value``. ``json`` (for a log pipeline:
the Kubernetes kit sets it): every line one JSON object with ``time``, ``level``, ``logger``,
``request_id`` and ``message``, a structured record's fields as fields, a traceback as ``error``.
Before, the access log's lines were JSON among plain ones; now neither format mixes with the other.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from server.observability.request_ids import RequestIdFilter

FIELDS = "fields"  # a record's structured fields: logger.info("request", extra={FIELDS: {...}})


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, FIELDS, None)
    return dict(fields) if isinstance(fields, dict) else {}


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        return line + "".join(f" {k}={v}" for k, v in fields.items()) if fields else line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Root logging for ``python -m server`` and its processes: every line in one format, with its
    request id."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
