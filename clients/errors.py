"""The SDK's errors: everything that goes wrong is an :class:`XLNetQAError` subclass (never an httpx or
pydantic exception), built from the server's response by :func:`error_from`, with the server's error kind,
request id and, for 429, its ``Retry-After`` (:func:`retry_after`)."""

from __future__ import annotations

import email.utils
import math
import time
from typing import Any

import httpx


class XLNetQAError(Exception):
    """A request failed. ``status_code`` is None when no HTTP response came back."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        error: str | None = None,
        body: Any = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(f"{status_code}: {message}" if status_code else message)
        self.message = message
        self.status_code = status_code
        self.error = error  # the server's machine-readable kind, e.g. "validation_error"
        self.body = body
        self.request_id = request_id  # quote it when reporting a server problem


class XLNetQAClientError(XLNetQAError):
    """4xx: the request is wrong (bad input, too large); not retried."""


class XLNetQAServerError(XLNetQAError):
    """5xx: the server failed or is unavailable (503 after all retries)."""


class XLNetQAConnectionError(XLNetQAError):
    """The server could not be reached after all retries."""


class XLNetQATimeoutError(XLNetQAError):
    """No response within ``timeout`` (one attempt) or ``deadline`` (the whole call with retries)."""


class XLNetQAAuthenticationError(XLNetQAClientError):
    """401: no API key, or one the server does not know (``api_key=`` or ``XLNETQA_API_KEY``)."""


class XLNetQARateLimitError(XLNetQAClientError):
    """429: this key is over a rate, window or daily limit; ``retry_after`` is the server's hint (s).
    Retried while the hint fits in what is left of the call's deadline and retries remain."""

    def __init__(self, *args: Any, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.retry_after = retry_after


class XLNetQAResponseError(XLNetQAError):
    """The server answered, but not in the shape the API promises (a proxy's page, a version mismatch)."""


def error_from(response: httpx.Response) -> XLNetQAError:
    try:
        body = response.json()
    except ValueError:
        body = response.text[:1000]
    request_id = response.headers.get("x-request-id")
    if isinstance(body, dict):
        message = str(body.get("message") or body.get("detail") or body)
        kind = body.get("error")
        request_id = body.get("request_id") or request_id
    else:
        message, kind = (str(body) or response.reason_phrase), None
    if response.status_code == 401:
        return XLNetQAAuthenticationError(message, 401, kind, body, request_id)
    if response.status_code == 429:
        hint = retry_after(response)
        return XLNetQARateLimitError(message, 429, kind, body, request_id, retry_after=hint)
    cls = XLNetQAClientError if response.status_code < 500 else XLNetQAServerError
    return cls(message, response.status_code, kind, body, request_id)


def retry_after(response: httpx.Response | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), None if absent, unreadable or not
    a finite number (``inf``, ``nan``, a date past what the platform's clock holds)."""
    value = response.headers.get("retry-after") if response is not None else None
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None
