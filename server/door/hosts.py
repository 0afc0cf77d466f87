"""Which ``Host`` headers the server answers: a defence against DNS rebinding, where a web page makes
the victim's browser send requests to a server on the victim's own machine under the attacker's
hostname. The probes (``/healthz``, ``/readyz``) answer any host. A server bound to loopback accepts
only loopback names by default; ``--trusted-hosts``
sets the list (``*``: any), and a server bound elsewhere accepts any host unless given one.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.errors import error_response
from server.door.key_check import PROBES
from server.observability.metrics import Metrics

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost: only this machine can connect."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host of a Host header, without the port and brackets, lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_hosts(trusted: str | None, bound_to_loopback: bool) -> frozenset[str] | None:
    """The accepted host names, or None for any."""
    if trusted is None:
        return LOOPBACK_NAMES if bound_to_loopback else None
    names = {host_name(h) for h in trusted.split(",") if h.strip()}
    return None if "*" in names else frozenset(names)


class HostCheckMiddleware:
    """400 ``invalid_host`` (JSON) for a request whose Host header names no accepted host."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None, metrics: Metrics) -> None:
        self.app, self.allowed, self.metrics = app, allowed, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The probes answer any host: kubelets and load balancers call them by address.
        if scope["type"] == "http" and self.allowed is not None and scope.get("path") not in PROBES:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if host_name(host) not in self.allowed:
                response = error_response(
                    self.metrics, 400, "invalid_host", "the Host header names no host this server answers for",
                    headers={"Connection": "close"},
                )  # fmt: skip
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
