"""API keys: who may ask. Keys come from a file (``--api-keys-file``) and/or the ``XLNETQA_API_KEYS``
environment variable, never from a command-line value that ``ps`` would show.

Format, one key per line (blank lines and ``#`` comments ignored)::

    team-a: 3f7c1e...        # name: key (the name is what logs and metrics show)
    9b2d4a...                # key alone: named key-<first 8 hex digits of its SHA-256>

The environment variable holds the same lines separated by newlines or commas. A key is 16 to 256
characters of ``A-Z a-z 0-9 . _ ~ + / = -``; a name 1 to 64 of ``A-Z a-z 0-9 . _ -``. Only SHA-256
digests are kept in memory, and a presented key is compared with every stored digest in constant
time (``hmac.compare_digest``), so neither the comparison's time nor a log line says anything of a
key. Problems in the file name the line, never its text.

Rotation without downtime: the file is read again on SIGHUP and whenever its modification time,
size or inode changes (checked at most once a second, on the next request); the new set replaces
the old in one assignment, so a request already authenticated is never affected, and a client
moving from an old key to a new one is served throughout when the file holds both during the move.
A reload that fails (unreadable file, a bad line, no keys left) keeps the previous keys and logs why.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("server.auth")

KEYS_ENV = "XLNETQA_API_KEYS"
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
CHECK_INTERVAL_S = 1.0  # how often a request may look at the keys file's metadata


class KeyFileError(ValueError):
    """The keys could not be read; the message names the source and the line, never a key."""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def parse_keys(text: str, source: str) -> dict[bytes, str]:
    """``{sha256(key): name}`` from key lines (see the module doc); KeyFileError on any bad line."""
    keys: dict[bytes, str] = {}
    names: set[str] = set()
    for number, raw in enumerate(text.replace(",", "\n").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, key = line.partition(":")
        name, key = (name.strip(), key.strip()) if sep else ("", name.strip())
        if not KEY_PATTERN.fullmatch(key):
            raise KeyFileError(
                f"{source} line {number}: a key must be 16-256 characters of A-Z a-z 0-9 . _ ~ + / = -"
            )
        d = digest(key)
        name = name or f"key-{d.hex()[:8]}"
        if not NAME_PATTERN.fullmatch(name):
            raise KeyFileError(
                f"{source} line {number}: a key name must be 1-64 characters of A-Z a-z 0-9 . _ -"
            )
        if d in keys:
            raise KeyFileError(f"{source} line {number}: the same key appears twice")
        if name in names:
            raise KeyFileError(f"{source} line {number}: the name {name!r} appears twice")
        keys[d] = name
        names.add(name)
    return keys


@dataclass(frozen=True)
class _FileStamp:
    mtime_ns: int
    size: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> _FileStamp | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return cls(st.st_mtime_ns, st.st_size, st.st_ino)


class KeyRing:
    """The valid keys: loaded at start, reloaded on change or SIGHUP, looked up in constant time."""

    def __init__(self, path: Path | None = None, env_text: str | None = None) -> None:
        self.path = path
        self.env_text = env_text
        self._keys: dict[bytes, str] = {}
        self._stamp: _FileStamp | None = None
        self._next_check = 0.0
        self._lock = threading.Lock()
        self.reloads = 0
        self.load()  # KeyFileError at start: the server refuses to start

    @classmethod
    def from_settings(cls, path: Path | None, env: dict[str, str] | None = None) -> KeyRing | None:
        """The configured keys, or None when neither a file nor the variable is given (auth off)."""
        text = (os.environ if env is None else env).get(KEYS_ENV) or None
        if path is None and text is None:
            return None
        return cls(path, text)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys.values()))

    def _read(self) -> tuple[dict[bytes, str], _FileStamp | None]:
        keys: dict[bytes, str] = {}
        stamp = None
        if self.env_text:
            keys |= parse_keys(self.env_text, KEYS_ENV)
        if self.path is not None:
            stamp = _FileStamp.of(self.path)
            try:
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise KeyFileError(f"{self.path}: cannot read the keys file ({type(exc).__name__})") from None
            from_file = parse_keys(text, str(self.path))
            clash = set(from_file.values()) & set(keys.values())
            if clash or set(from_file) & set(keys):
                raise KeyFileError(f"{self.path}: a key or name is also in {KEYS_ENV}")
            keys |= from_file
        if not keys:
            raise KeyFileError(f"{self.path or KEYS_ENV}: no API keys (auth is on, so nobody could ask)")
        return keys, stamp

    def load(self) -> None:
        """Read the keys now; KeyFileError leaves the current ones in place."""
        keys, stamp = self._read()
        with self._lock:
            self._keys, self._stamp = keys, stamp  # one assignment: a lookup sees the old set or the new
            self.reloads += 1
        logger.info("API keys loaded: %d (%s)", len(keys), ", ".join(sorted(keys.values())))

    def reload(self) -> bool:
        """Reload (SIGHUP, or the file changed); on failure keep the previous keys and log why."""
        try:
            self.load()
            return True
        except KeyFileError as exc:
            logger.error("API keys not reloaded, the previous %d stay valid: %s", len(self._keys), exc)
            with self._lock:
                self._stamp = _FileStamp.of(self.path) if self.path else None  # do not retry every second
            return False

    def maybe_reload(self) -> None:
        """Reload when the file's metadata changed (looked at no more than once per CHECK_INTERVAL_S)."""
        if self.path is None:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_INTERVAL_S
        if _FileStamp.of(self.path) != self._stamp:
            self.reload()

    def identify(self, presented: str | None) -> str | None:
        """The name of the key presented, or None. Every stored digest is compared, in constant time."""
        if not presented:
            return None
        self.maybe_reload()
        d = digest(presented)
        found = None
        for stored, name in self._keys.items():
            if hmac.compare_digest(stored, d):
                found = name
        return found


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    """The key from ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (the first given)."""
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return key or None
