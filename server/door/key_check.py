"""The door: every HTTP request needs a valid API key, except the few paths named open.

Default deny: the open paths are listed (probes, and what the operator opened: the playground's
page and files, the docs, ``/metrics``); everything else, every route added later and every path
that matches no route, answers 401 without a key, so an unauthenticated caller cannot even tell
which paths exist. Missing and wrong keys get the same 401 (``WWW-Authenticate: Bearer``, error
``unauthorized``). The key decides first: a valid key is let in whatever its address has done, so
one client failing from an address shared with others (an ingress, a NAT) cannot lock them out. A
refused caller whose address is over its failure budget gets 429 + Retry-After instead of 401: the
budget bounds what refusals cost; guessing is stopped by the keys' strength (:mod:`server.door.auth`). The
address is the real client's only where a named proxy vouches for it (``--forwarded-allow-ips``). A caller let in is held to its request rate and daily quota here, before
its body is read (:mod:`server.limits.quotas`; 429 ``rate_limited``): a flood of malformed bodies is throttled
too. The caller's key name goes into the request's state (``key_name``, never the key), where
the routes (per-key limits) and the access log read it; it is ``anonymous`` when keys are off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.errors import engine_unavailable_response, error_response, rate_limited_response
from server.door.auth import KeyRing, presented_key
from server.door.body_limit import LINGER_S, discard_body
from server.door.connection import CONNECTION_SCOPE_KEY
from server.limits.quotas import FailureLimiter, OverLimit
from server.observability.metrics import Metrics
from server.observability.observe import KEY_NAME
from server.observability.timing import stage_clock
from server.topology.engine.failures import EngineUnavailable

ANONYMOUS = "anonymous"
PROBES = ("/healthz", "/readyz")
PLAYGROUND_PATHS = ("/", "/playground/*")
DOCS_PATHS = ("/docs", "/openapi.json")
METRICS_PATHS = ("/metrics",)
UNAUTHORIZED_MESSAGE = "a valid API key is required: Authorization: Bearer <key>, or X-API-Key: <key>"
LINGER_BYTES = 1024 * 1024  # a refused body up to this size is read (briefly) so the client sees the 401


@dataclass(frozen=True)
class OpenPaths:
    """Paths served without a key: exact ones, and prefixes written ``/prefix/*``."""

    exact: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, paths: Iterable[str]) -> OpenPaths:
        paths = list(paths)
        return cls(
            frozenset(p for p in paths if not p.endswith("/*")),
            tuple(p[:-1] for p in paths if p.endswith("/*")),
        )

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        return path in self.exact or any(
            path.startswith(p) and "/" not in path[len(p) :] for p in self.prefixes
        )


UNAUTHENTICATED = "-"  # the caller of a request the door refused


class DoorLimits(Protocol):
    """The per-key limits the door checks: this process's (:class:`server.limits.quotas.CallerQuotas`) or the
    engine process's (:class:`server.topology.engine.client.EngineClient`)."""

    async def admit(self, name: str) -> None:
        """Count one request of ``name``; OverLimit when it is over its rate or daily quota."""


def caller_name(scope: Scope) -> str:
    """The key name the door recorded for this request (``anonymous`` without keys, ``-`` refused)."""
    return str((scope.get("state") or {}).get(KEY_NAME, UNAUTHENTICATED))


class DoorMiddleware:
    """Pure ASGI: authenticates every request but the open ones (see the module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyRing | None,
        open_paths: OpenPaths,
        failures: FailureLimiter,
        quotas: DoorLimits,
        metrics: Metrics,
        retry_after_s: int = 1,
    ) -> None:
        self.app, self.keys, self.open_paths = app, keys, open_paths
        self.failures, self.quotas, self.metrics = failures, quotas, metrics
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        headers = dict(scope.get("headers") or [])
        entered = time.perf_counter()
        if self.keys is None:
            state[KEY_NAME] = ANONYMOUS
            await self._admitted(ANONYMOUS, scope, receive, send, headers, entered)
            return
        presented = presented_key(headers)
        name = self.keys.identify(presented)  # the key decides first: a valid one is always let in
        if name is not None:
            state[KEY_NAME] = name
            await self._admitted(name, scope, receive, send, headers, entered)
            return
        if scope.get("path") in self.open_paths:
            state[KEY_NAME] = ANONYMOUS
            await self.app(scope, receive, send)
            return
        address = (scope.get("client") or ("unknown", 0))[0]
        wait = self.failures.blocked_for(address)
        if wait > 0:  # over its budget: answered at once, its body never read
            self.metrics.auth_failures.labels("address_blocked").inc()
            response = error_response(
                self.metrics, 429, "too_many_auth_failures",
                "too many failed authentications from this address; retry later",
                headers={"Retry-After": str(max(1, math.ceil(wait))), "Connection": "close"},
            )  # fmt: skip
        else:
            self.metrics.auth_failures.labels("wrong_key" if presented is not None else "no_key").inc()
            self.failures.failed(address)
            response = error_response(
                self.metrics, 401, "unauthorized", UNAUTHORIZED_MESSAGE,
                headers={"WWW-Authenticate": "Bearer", "Connection": "close"},
            )  # fmt: skip
        await _refuse(response, scope, receive, send, headers, linger=wait <= 0)

    async def _admitted(
        self,
        name: str,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[bytes, bytes],
        entered: float,
    ) -> None:
        """A caller let in: its request rate and daily quota (the probes are free), then the app. Only a
        request within its key's limits vouches for its connection (server.door.pool): a probe or a
        refusal leaves it unvouched, so neither can hold slots of --max-connections for a key."""
        connection = scope.get(CONNECTION_SCOPE_KEY)
        if scope.get("path") not in PROBES:
            try:
                await self.quotas.admit(name)
            except OverLimit as exc:
                response = rate_limited_response(self.metrics, exc, close=True)
                await _refuse(response, scope, receive, send, headers)
                return
            except EngineUnavailable as exc:  # the engine process restarts: a clean 503, never a 500
                response = engine_unavailable_response(self.metrics, exc, self.retry_after_s)
                await _refuse(response, scope, receive, send, headers)
                return
            if connection is not None:
                connection.vouch(name)
        clock = stage_clock(scope)
        if clock is not None:
            clock.admitted = clock.since("auth", entered)
        await self.app(scope, receive, send)


async def _refuse(
    response: Response,
    scope: Scope,
    receive: Receive,
    send: Send,
    headers: dict[bytes, bytes],
    linger: bool = True,
) -> None:
    """Send a refusal. A small body still on its way is read first (briefly) so the client sees the
    answer instead of a reset, unless the client waits for ``100 Continue`` (reading would invite the body
    the refusal is for), ``linger`` is off (an address over its failure budget), or the connections are
    nearly all taken. While it reads, its connection counts as idle: the pool may close it for a
    newcomer, and its address's cap counts it."""
    declared = headers.get(b"content-length", b"")
    expects_continue = headers.get(b"expect", b"").lower() == b"100-continue"
    connection = scope.get(CONNECTION_SCOPE_KEY)
    crowded = connection is not None and connection.pool_nearly_full
    if (
        linger
        and not crowded
        and declared.isdigit()
        and 0 < int(declared) <= LINGER_BYTES
        and not expects_continue
    ):
        if connection is not None:
            connection.lingering = True
        await discard_body(receive, LINGER_S)
    await response(scope, receive, send)
