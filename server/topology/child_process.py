"""Children of the server's process (the engine, the metrics port) never outlive it."""

from __future__ import annotations

import contextlib
import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux's parent-death signal; elsewhere
    nothing, and the child watches its parent itself)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
