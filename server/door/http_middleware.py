"""The base of the server's own ASGI middleware: it acts on HTTP requests only, and lets lifespan (and
any other) scopes through untouched, so each middleware says only what it does to a request."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """Subclasses implement :meth:`http`; :meth:`__call__` routes every other scope to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError
