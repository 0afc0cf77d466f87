"""Sync and async clients for the XLNet QA server (httpx + pydantic only).

Errors: everything that goes wrong is an :class:`XLNetQAError` subclass, never an httpx or pydantic
exception: 4xx :class:`XLNetQAClientError`, 5xx :class:`XLNetQAServerError`, unreachable
:class:`XLNetQAConnectionError`, no answer in time :class:`XLNetQATimeoutError`, a response that is not
what the API promises :class:`XLNetQAResponseError`. Each carries the server's error kind and request
id when there was one.

Retries: connection failures and 503 (not ready, unhealthy, overloaded, shutting down) are retried with
jittered exponential backoff, honouring the server's ``Retry-After`` (capped by ``max_backoff``), all
within ``deadline`` seconds per call (60 by default; None for none). A 429 is waited out only when its
``Retry-After`` is within ``max_backoff`` and the deadline: a key over its daily quota raises at once
instead of sleeping until midnight. Every other error, in particular 4xx, is raised at once, because
sending the same bad request again cannot succeed.

Keys travel only where they cannot be read on the way: a client with an API key refuses a plain
``http://`` URL to any host but this machine's loopback, unless ``allow_insecure_http=True`` says the
network in between is trusted. Answer requests are pure functions of
their input, so retrying them is safe; a read timeout is not retried (the server may still be working
on it, and a retry would double its load).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import ssl
import string
import time
from collections.abc import Awaitable, Generator, Iterable, Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from clients.errors import (  # the error classes stay importable from here too, as before clients.errors
    XLNetQAAuthenticationError,  # noqa: F401
    XLNetQAClientError,
    XLNetQAConnectionError,
    XLNetQAError,
    XLNetQARateLimitError,  # noqa: F401
    XLNetQAResponseError,
    XLNetQAServerError,  # noqa: F401
    XLNetQATimeoutError,
    error_from,
    retry_after,
)
from clients.models import Answer, ModelInfo, QARequest, request_payload

DEFAULT_DEADLINE_S = 60.0  # one call, retries included, unless the caller sets another (None: none)
_RETRY_TRANSPORT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.PoolTimeout,
)
_NO_ANSWER_IN_TIME = (httpx.ReadTimeout, httpx.WriteTimeout)

API_KEY_ENV = "XLNETQA_API_KEY"  # the key when api_key= is not given
BatchItem = QARequest | Mapping[str, Any] | tuple[str, str]
Model = TypeVar("Model", bound=BaseModel)


def _parse(model: type[Model], response: httpx.Response, key: str | None = None) -> Any:
    """The response body as ``model`` (a list of them under ``key``), or XLNetQAResponseError."""
    request_id = response.headers.get("x-request-id")
    try:
        data = response.json()
        if key is None:
            return model.model_validate(data)
        return [model.model_validate(item) for item in data[key]]
    except (ValueError, ValidationError, KeyError, TypeError) as exc:
        detail = exc.errors(include_url=False)[:3] if isinstance(exc, ValidationError) else repr(exc)[:200]
        message = f"the server's response is not a valid {model.__name__}: {detail}"
        raise XLNetQAResponseError(
            message, response.status_code, body=response.text[:1000], request_id=request_id
        ) from None


def _loopback(host: str) -> bool:
    """Whether ``host`` is this machine (localhost, 127.0.0.0/8, ::1): nothing in between to read a key."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _request_payload(**fields: Any) -> dict[str, Any]:
    """One request item, or XLNetQAClientError (no status: nothing was sent) naming what is wrong."""
    try:
        return request_payload(QARequest.model_validate({k: v for k, v in fields.items() if v is not None}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)[:5]
        )
        raise XLNetQAClientError(f"invalid request: {problems}") from None


def _batch_payload(items: Iterable[BatchItem]) -> list[dict[str, Any]]:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, QARequest):
            out.append(request_payload(item))
        elif isinstance(item, tuple) and len(item) == 2:
            out.append(_request_payload(question=item[0], context=item[1]))
        elif isinstance(item, Mapping):
            out.append(_request_payload(**item))
        else:
            raise XLNetQAClientError(
                f"items[{i}] must be a QARequest, a mapping or a (question, context) pair"
            )
    return out


def _api_key(api_key: str | None) -> str | None:
    """The key from ``api_key=`` (else ``XLNETQA_API_KEY``; unset or blank there: no key), stripped of
    surrounding whitespace and checked here, so a malformed key is one ValueError naming the rule and
    the source instead of an httpx error that quotes the header it was put in. The text never holds it."""
    source = "api_key="
    if api_key is None:
        api_key, source = os.environ.get(API_KEY_ENV, "").strip() or None, API_KEY_ENV
        if api_key is None:
            return None
    if not isinstance(api_key, str):
        raise ValueError(f"the API key from {source} must be a string, got {type(api_key).__name__}")
    key = api_key.strip()
    if not key:
        problem = "is empty (leave api_key out, or pass None, for no key)"
    elif not key.isascii():
        problem = "holds a non-ASCII character"
    elif any(c in string.whitespace for c in key):
        problem = "holds whitespace inside it"
    elif not key.isprintable():
        problem = "holds a control character"
    else:
        return key
    raise ValueError(f"the API key from {source} {problem}: a key is printable ASCII without spaces")


class _BearerAuth(httpx.Auth):
    """``Authorization: Bearer <key>`` set on each request as it is sent. The one place the key lives:
    a slot (not in ``vars()``), never in the httpx client's default headers, hidden from ``repr``."""

    __slots__ = ("_header",)

    def __init__(self, key: str) -> None:
        self._header = f"Bearer {key}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._header
        yield request

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<hidden>)"


class _Attempts:
    """The retry bookkeeping of one call: what to do after each attempt, within the overall deadline."""

    def __init__(self, policy: _Policy) -> None:
        self.policy = policy
        self.attempt = 0
        self.ends = None if policy.deadline is None else time.monotonic() + policy.deadline

    def left(self) -> float:
        """Seconds until the call's deadline (infinite without one)."""
        return float("inf") if self.ends is None else self.ends - time.monotonic()

    def timeout(self) -> float:
        """This attempt's timeout: the client's, cut to what is left of the deadline."""
        left = self.left()
        if left <= 0:
            raise XLNetQATimeoutError(
                f"no answer from {self.policy.base_url} within the {self.policy.deadline:g} s deadline"
            )
        return min(self.policy.timeout, left)

    def check(self) -> None:
        """Raise XLNetQATimeoutError once the deadline has passed (between attempts and while reading)."""
        self.timeout()

    def _wait(self, delay: float, error: XLNetQAError) -> float:
        """``delay`` before the next attempt, or ``error`` when retries or time have run out."""
        self.attempt += 1
        if self.attempt > self.policy.retries or delay >= self.left():
            raise error
        return delay

    def after_transport_error(self, exc: httpx.HTTPError) -> float:
        where = self.policy.base_url
        if isinstance(exc, _NO_ANSWER_IN_TIME):
            raise XLNetQATimeoutError(
                f"no response from {where} within {self.policy.timeout:g} s: {exc!r}"
            ) from exc
        error = XLNetQAConnectionError(f"cannot reach {where}: {exc!r}")
        if not isinstance(exc, _RETRY_TRANSPORT):
            raise error from exc
        return self._wait(self.policy._delay(self.attempt, None), error)

    def after_response(self, response: httpx.Response) -> float | None:
        """None when the response is final (a success), a delay before retrying a 503; raises errors."""
        if response.status_code == 503:
            return self._wait(self.policy._delay(self.attempt, response), error_from(response))
        if response.status_code == 429:  # only with the server's hint: waiting it out may succeed
            error = error_from(response)
            hint = retry_after(response)
            if hint is None or hint > self.policy.max_backoff:  # a long wait is the caller's to choose
                raise error
            return self._wait(hint * random.uniform(1.0, 1.1), error)
        if response.is_error:
            raise error_from(response)
        return None


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
        deadline: float | None = DEFAULT_DEADLINE_S,
        api_key: str | None = None,
        verify: bool | str | ssl.SSLContext = True,
        allow_insecure_http: bool = False,
    ) -> None:
        if retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError("retries, backoff and max_backoff must be >= 0")
        if timeout <= 0 or (deadline is not None and deadline <= 0):
            raise ValueError("timeout and deadline must be > 0")
        url = httpx.URL(base_url)
        if url.userinfo:
            raise ValueError("base_url must not hold credentials; pass api_key= (or set XLNETQA_API_KEY)")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.headers = dict(headers or {})
        self.deadline = deadline
        self.verify = verify  # a CA bundle's path, an SSLContext, True (system CAs) or False (explicit)
        key = _api_key(api_key)
        if key is not None and url.scheme == "http" and not _loopback(url.host) and not allow_insecure_http:
            raise ValueError(
                f"an API key would go in clear text to {url.host} (http://): use https://, or pass "
                "allow_insecure_http=True if the network in between is trusted"
            )
        self._auth = _BearerAuth(key) if key is not None else None

    def _http_options(self, timeout: float) -> dict[str, Any]:
        """What the blocking and the asyncio httpx clients are both built with."""
        return {
            "base_url": self.base_url,
            "timeout": timeout,
            "headers": self.headers,
            "verify": self.verify,
            "auth": self._auth,
        }

    def __repr__(self) -> str:  # never the key (nor any header)
        return f"{type(self).__name__}({self.base_url!r}, timeout={self.timeout}, retries={self.retries})"

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Retry-After when the server sent one (plus up to 10% jitter, so clients told the same do not
        return in lockstep), else backoff * 2**attempt with full jitter; capped at max_backoff."""
        hinted = retry_after(response)
        if hinted is not None:
            return min(hinted * random.uniform(1.0, 1.1), self.max_backoff)
        base = self.backoff * (2**attempt)
        return min(self.max_backoff, base / 2 + random.uniform(0, base / 2))

    @staticmethod
    def _answer_payload(
        question: str, context: str, top_k: int | None, max_answer_len: int | None, threshold: float | None
    ) -> dict[str, Any]:
        """Only what the caller set: the server's (and the model's) defaults apply to the rest."""
        return _request_payload(
            question=question,
            context=context,
            top_k=top_k,
            max_answer_len=max_answer_len,
            threshold=threshold,
        )


class XLNetQAClient(_Policy):
    """Blocking client; use as a context manager or call :meth:`close`."""

    def __init__(
        self, base_url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.1, **kw: Any
    ) -> None:
        super().__init__(base_url, timeout, retries, backoff, **kw)
        self._http = httpx.Client(**self._http_options(timeout))

    def __enter__(self) -> XLNetQAClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        attempts = _Attempts(self)
        while True:
            try:
                response = self._send(method, path, json, attempts)
            except httpx.HTTPError as exc:
                time.sleep(attempts.after_transport_error(exc))
                continue
            delay = attempts.after_response(response)
            if delay is None:
                return response
            time.sleep(delay)

    def _send(self, method: str, path: str, json: Any, attempts: _Attempts) -> httpx.Response:
        """One attempt; with a deadline the body is read chunk by chunk and the deadline checked after
        each, so a server trickling bytes cannot hold the call past it (by more than one read)."""
        if self.deadline is None:
            return self._http.request(method, path, json=json, timeout=attempts.timeout())
        request = self._http.build_request(method, path, json=json, timeout=attempts.timeout())
        response = self._http.send(request, stream=True)
        try:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                attempts.check()
        finally:
            response.close()
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx.Response(response.status_code, headers=headers, content=bytes(body), request=request)

    def _probe(self, path: str) -> bool:
        try:
            return self._http.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def answer(
        self,
        question: str,
        context: str,
        top_k: int | None = None,
        max_answer_len: int | None = None,
        threshold: float | None = None,
    ) -> Answer:
        """Answer one question about ``context`` (``context[a.start:a.end] == a.answer``)."""
        payload = self._answer_payload(question, context, top_k, max_answer_len, threshold)
        return _parse(Answer, self._request("POST", "/v1/answer", payload))

    def answer_batch(self, items: Iterable[BatchItem]) -> list[Answer]:
        """Answer several questions in one request; results in the same order."""
        return _parse(
            Answer, self._request("POST", "/v1/answer/batch", {"items": _batch_payload(items)}), "results"
        )

    def health(self) -> bool:
        """True when the server process answers (no retries)."""
        return self._probe("/healthz")

    def ready(self) -> bool:
        """True when the model is loaded and warmed up (no retries)."""
        return self._probe("/readyz")

    def model_info(self) -> ModelInfo:
        return _parse(ModelInfo, self._request("GET", "/v1/model"))


class AsyncXLNetQAClient(_Policy):
    """asyncio client with the same API as :class:`XLNetQAClient` (methods are coroutines)."""

    def __init__(
        self, base_url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.1, **kw: Any
    ) -> None:
        super().__init__(base_url, timeout, retries, backoff, **kw)
        self._http = httpx.AsyncClient(**self._http_options(timeout))

    async def __aenter__(self) -> AsyncXLNetQAClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        attempts = _Attempts(self)
        while True:
            try:
                call = self._http.request(method, path, json=json, timeout=attempts.timeout())
                response = await (call if self.deadline is None else self._within_deadline(call, attempts))
            except httpx.HTTPError as exc:
                await asyncio.sleep(attempts.after_transport_error(exc))
                continue
            delay = attempts.after_response(response)
            if delay is None:
                return response
            await asyncio.sleep(delay)

    async def _within_deadline(self, call: Awaitable[httpx.Response], attempts: _Attempts) -> httpx.Response:
        """The attempt, cancelled when the call's deadline passes (a trickling server cannot hold it)."""
        try:
            return await asyncio.wait_for(call, attempts.left())
        except asyncio.TimeoutError:
            attempts.check()  # the deadline has passed: XLNetQATimeoutError
            raise httpx.ReadTimeout("no complete response within the attempt's timeout") from None

    async def _probe(self, path: str) -> bool:
        try:
            return (await self._http.get(path)).status_code == 200
        except httpx.HTTPError:
            return False

    async def answer(
        self,
        question: str,
        context: str,
        top_k: int | None = None,
        max_answer_len: int | None = None,
        threshold: float | None = None,
    ) -> Answer:
        payload = self._answer_payload(question, context, top_k, max_answer_len, threshold)
        return _parse(Answer, await self._request("POST", "/v1/answer", payload))

    async def answer_batch(self, items: Iterable[BatchItem]) -> list[Answer]:
        response = await self._request("POST", "/v1/answer/batch", {"items": _batch_payload(items)})
        return _parse(Answer, response, "results")

    async def health(self) -> bool:
        return await self._probe("/healthz")

    async def ready(self) -> bool:
        return await self._probe("/readyz")

    async def model_info(self) -> ModelInfo:
        return _parse(ModelInfo, await self._request("GET", "/v1/model"))
