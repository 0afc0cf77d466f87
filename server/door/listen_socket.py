"""``--listen-fd``: a listening socket the server inherits instead of binding one.

Whoever starts the server binds the port (systemd socket activation, a supervisor, a test harness on
port 0) and hands the socket over; the server checks, before anything else, that it really is a
listening TCP socket, and serves it. Binding a port that was only probed free leaves a moment in which
another program can take it; a socket handed over leaves none.
"""

from __future__ import annotations

import socket


class ListenSocketError(RuntimeError):
    """The inherited descriptor is not a listening TCP socket (one line, before anything listens)."""


def adopt(fd: int) -> socket.socket:
    """The listening TCP socket at descriptor ``fd``, or ListenSocketError saying what is wrong."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ListenSocketError(f"--listen-fd {fd}: not a socket ({exc.strerror or exc})") from None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ListenSocketError(f"--listen-fd {fd}: not a TCP socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ListenSocketError(
            f"--listen-fd {fd}: the socket is not listening (call listen() before handing it over)"
        )
    sock.set_inheritable(True)  # the front processes serve it too
    return sock


def bound_to(sock: socket.socket) -> tuple[str, int]:
    """(host, port) the socket listens on, for the log."""
    host, port = sock.getsockname()[:2]
    return str(host), int(port)
