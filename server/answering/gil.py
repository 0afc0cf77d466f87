"""The interpreter's thread switching, tuned for a server's latency.

A server process runs its event loop beside helper threads that hold the interpreter lock for long
stretches (tokenizing and decoding long inputs, a backend's Python around its calls). With CPython's
default switch interval (5 ms) the event loop waits up to that long each time it needs the lock back,
several times per request: a short request beside one tenant's long inputs took several times as long
as alone (tests/test_server_floods.py asserts the result). At 0.5 ms the loop gets the lock back
within about a millisecond, and the helper threads lose no measurable throughput: the lock changes
hands only when someone waits for it.
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.0005


def prefer_latency() -> None:
    """Hand the interpreter lock over every ``SWITCH_INTERVAL_S`` to a thread waiting for it."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
