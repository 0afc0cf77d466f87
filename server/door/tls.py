"""TLS done by the server's own connection protocol, so that a handshake obeys the same rules as a
request's headers.

Given a certificate, uvicorn hands TLS to the event loop, which waits 60 s for a ClientHello and
creates the HTTP protocol's connection only once the handshake is done: a client that opens TCP
connections and never speaks held each for 60 s, past ``--header-timeout-s``, and uncounted by
``--max-connections``. Here the HTTP protocol is created (and counted) when the TCP connection is
accepted, the handshake must finish within the header deadline, and the deadline for the request's
headers keeps counting from the accept (:mod:`server.door.connection`).

The private key is loaded with a password callback that refuses: an encrypted key is one clear error
before anything listens, never OpenSSL's "Enter PEM pass phrase" prompt on the operator's terminal.
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable
from pathlib import Path


class TlsSetupError(ValueError):
    """The certificate or key cannot be used; the message is one line for the operator."""


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKey


def server_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """The TLS context for ``certfile`` + ``keyfile`` (TlsSetupError, one line, when it cannot be)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(certfile), str(keyfile), password=_no_passphrase)
    except _EncryptedKey:
        raise TlsSetupError(
            f"TLS: {keyfile} is encrypted and the server never prompts for its pass phrase: give it the key "
            "decrypted (openssl pkey -in KEY -out KEY.plain), readable only by the server's user"
        ) from None
    except (OSError, ssl.SSLError) as exc:
        raise TlsSetupError(f"TLS: cannot use {certfile} with {keyfile}: {exc}") from None
    return context


class HandshakeProtocol(SSLProtocol):
    """asyncio's TLS protocol around an HTTP protocol, with a handshake deadline; calls ``accepted`` with
    the TCP transport at accept and ``released`` once it is gone (asyncio tells the HTTP protocol only
    if the handshake finished)."""

    def __init__(
        self,
        http: asyncio.Protocol,
        context: ssl.SSLContext,
        deadline_s: float,
        released: Callable[[], None],
        accepted: Callable[[asyncio.BaseTransport], None] | None = None,
    ) -> None:
        # No waiter (asyncio allows None; typeshed does not): a failed handshake has nobody to tell.
        super().__init__(
            asyncio.get_running_loop(),
            http,
            context,
            None,  # type: ignore[arg-type]
            server_side=True,
            ssl_handshake_timeout=deadline_s,  # type: ignore[arg-type]  # asyncio takes seconds as a float
        )
        self.raw_transport: asyncio.BaseTransport | None = None
        self._released = released
        self._accepted = accepted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw_transport = transport
        super().connection_made(transport)
        if self._accepted is not None:  # the HTTP protocol counts the connection from its accept
            self._accepted(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self.raw_transport = None
        self._released()
