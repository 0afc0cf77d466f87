"""Keys, keys files and waiting, for the tests of who may ask (test_server_auth, test_server_door)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-fedcba9876543210xyz"
CAROL = "carol-key-00112233445566778899"
WRONG = "not-a-valid-key-at-all-123456"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def keys_file(path: Path, *lines: str, mode: int = 0o600) -> Path:
    """A keys file holding ``lines`` (line 1 is the first of them), readable by its owner only."""
    path.write_text("\n".join(lines) + "\n")
    path.chmod(mode)
    return path


def until(condition: Callable[[], object], what: str, seconds: float = 10.0) -> None:
    """Poll ``condition`` every 0.1 s; fail with ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
