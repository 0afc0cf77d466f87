"""The error a route or the model's lifecycle raises to answer with a JSON error (status, kind, message).

Kept apart from :mod:`server.api.errors` (which turns it and FastAPI's own errors into responses) so that the
engine process, which raises it but serves no HTTP, never imports FastAPI.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error response raised from a route: status, kind and message (+ headers)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}
