"""Sync and async clients for the XLNet QA server (httpx + pydantic only).

Retries: connection failures and 503 (not ready, overloaded, shutting down) are retried with
exponential backoff, honouring the server's ``Retry-After`` (capped by ``max_backoff``); every other
error, in particular 4xx, is raised at once as an :class:`XLNetQAError` carrying the status code and
the server's message, because sending the same bad request again cannot succeed. Answer requests are
pure functions of their input, so retrying them is safe; a read timeout is not retried (the server may
still be working on it, and a retry would double its load).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from clients.models import Answer, ModelInfo, QARequest

_RETRY_TRANSPORT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.PoolTimeout,
)

BatchItem = QARequest | Mapping[str, Any] | tuple[str, str]


class XLNetQAError(Exception):
    """A request failed. ``status_code`` is None when the server could not be reached at all."""

    def __init__(
        self, message: str, status_code: int | None = None, error: str | None = None, body: Any = None
    ) -> None:
        super().__init__(f"{status_code}: {message}" if status_code else message)
        self.message = message
        self.status_code = status_code
        self.error = error  # the server's machine-readable kind, e.g. "validation_error"
        self.body = body


class XLNetQAClientError(XLNetQAError):
    """4xx: the request is wrong (bad input, too large); not retried."""


class XLNetQAServerError(XLNetQAError):
    """5xx: the server failed or is unavailable (503 after all retries)."""


class XLNetQAConnectionError(XLNetQAError):
    """The server could not be reached after all retries."""


def _error_from(response: httpx.Response) -> XLNetQAError:
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict):
        message = str(body.get("message") or body.get("detail") or body)
        kind = body.get("error")
    else:
        message, kind = (str(body) or response.reason_phrase), None
    cls = XLNetQAClientError if response.status_code < 500 else XLNetQAServerError
    return cls(message, response.status_code, kind, body)


def _retry_after(response: httpx.Response | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), None if absent or unreadable."""
    value = response.headers.get("retry-after") if response is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _batch_payload(items: Iterable[BatchItem]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        if isinstance(item, QARequest):
            out.append(item.payload())
        elif isinstance(item, tuple):
            out.append(QARequest(question=item[0], context=item[1]).payload())
        else:
            out.append(QARequest(**item).payload())
    return out


class _Policy:
    """Configuration and retry arithmetic shared by the sync and async clients."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError("retries, backoff and max_backoff must be >= 0")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.headers = dict(headers or {})

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Retry-After when the server sent one, else backoff * 2**attempt with jitter; capped."""
        hinted = _retry_after(response)
        if hinted is not None:
            return min(hinted, self.max_backoff)
        base = self.backoff * (2**attempt)
        return min(self.max_backoff, base / 2 + random.uniform(0, base / 2))

    def _retryable(self, response: httpx.Response, attempt: int) -> bool:
        return response.status_code == 503 and attempt < self.retries

    @staticmethod
    def _answer_payload(
        question: str, context: str, top_k: int, max_answer_len: int, threshold: float | None
    ) -> dict[str, Any]:
        return QARequest(
            question=question,
            context=context,
            top_k=top_k,
            max_answer_len=max_answer_len,
            threshold=threshold,
        ).payload()


class XLNetQAClient(_Policy):
    """Blocking client; use as a context manager or call :meth:`close`."""

    def __init__(
        self, base_url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.1, **kw: Any
    ) -> None:
        super().__init__(base_url, timeout, retries, backoff, **kw)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=self.headers)

    def __enter__(self) -> XLNetQAClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, json=json)
            except _RETRY_TRANSPORT as exc:
                if attempt == self.retries:
                    raise XLNetQAConnectionError(f"cannot reach {self.base_url}: {exc!r}") from exc
                time.sleep(self._delay(attempt, None))
                continue
            if self._retryable(response, attempt):
                time.sleep(self._delay(attempt, response))
                continue
            if response.is_error:
                raise _error_from(response)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _probe(self, path: str) -> bool:
        try:
            return self._http.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def answer(
        self,
        question: str,
        context: str,
        top_k: int = 1,
        max_answer_len: int = 30,
        threshold: float | None = None,
    ) -> Answer:
        """Answer one question about ``context`` (``context[a.start:a.end] == a.answer``)."""
        payload = self._answer_payload(question, context, top_k, max_answer_len, threshold)
        return Answer.model_validate(self._request("POST", "/answer", payload).json())

    def answer_batch(self, items: Iterable[BatchItem]) -> list[Answer]:
        """Answer several questions in one request; results in the same order."""
        data = self._request("POST", "/answer/batch", {"items": _batch_payload(items)}).json()
        return [Answer.model_validate(r) for r in data["results"]]

    def health(self) -> bool:
        """True when the server process answers (no retries)."""
        return self._probe("/healthz")

    def ready(self) -> bool:
        """True when the model is loaded and warmed up (no retries)."""
        return self._probe("/readyz")

    def model_info(self) -> ModelInfo:
        return ModelInfo.model_validate(self._request("GET", "/v1/model").json())


class AsyncXLNetQAClient(_Policy):
    """asyncio client with the same API as :class:`XLNetQAClient` (methods are coroutines)."""

    def __init__(
        self, base_url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.1, **kw: Any
    ) -> None:
        super().__init__(base_url, timeout, retries, backoff, **kw)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=self.headers)

    async def __aenter__(self) -> AsyncXLNetQAClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(method, path, json=json)
            except _RETRY_TRANSPORT as exc:
                if attempt == self.retries:
                    raise XLNetQAConnectionError(f"cannot reach {self.base_url}: {exc!r}") from exc
                await asyncio.sleep(self._delay(attempt, None))
                continue
            if self._retryable(response, attempt):
                await asyncio.sleep(self._delay(attempt, response))
                continue
            if response.is_error:
                raise _error_from(response)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _probe(self, path: str) -> bool:
        try:
            return (await self._http.get(path)).status_code == 200
        except httpx.HTTPError:
            return False

    async def answer(
        self,
        question: str,
        context: str,
        top_k: int = 1,
        max_answer_len: int = 30,
        threshold: float | None = None,
    ) -> Answer:
        payload = self._answer_payload(question, context, top_k, max_answer_len, threshold)
        return Answer.model_validate((await self._request("POST", "/answer", payload)).json())

    async def answer_batch(self, items: Iterable[BatchItem]) -> list[Answer]:
        data = (await self._request("POST", "/answer/batch", {"items": _batch_payload(items)})).json()
        return [Answer.model_validate(r) for r in data["results"]]

    async def health(self) -> bool:
        return await self._probe("/healthz")

    async def ready(self) -> bool:
        return await self._probe("/readyz")

    async def model_info(self) -> ModelInfo:
        return ModelInfo.model_validate((await self._request("GET", "/v1/model")).json())
