"""API keys: who may ask. Keys come from a file (``--api-keys-file``) and/or the ``XLNETQA_API_KEYS``
environment variable, never from a command-line value that ``ps`` would show.

File format, one key per line; a ``#`` starts a comment that runs to the end of its line, and is
removed before anything else is read (so text in a comment can never become a key)::

    team-a: 3f7c1e...        # name: key (the name is what logs and metrics show)
    9b2d4a...                # key alone: named key-<12 hex digits of its SHA-256>

The environment variable is a list: ``name: key`` or bare keys separated by commas or newlines (bare
ones are named the same way). A key's name is its identity for its limits and quotas, so it follows
the key, never the line it is on: a comment added above a bare key changes nothing. The 48 bits of
digest in a bare key's name cannot help anyone guess a key of 128 bits or more (the strength rule).

The keys file must be readable and writable by its owner only (mode 0600, or 0640 with a group of the
server's own user, as Kubernetes mounts a Secret with fsGroup): a file another local user can read
hands them every key, one they can write lets them add their own. Such a file is
refused at start (``--allow-shared-keys-file`` accepts it, with a warning), and on a reload its keys are
withdrawn, as for an unreadable file.

A key is 16 to 256 characters of ``A-Z a-z 0-9 . _ ~ + / = -`` and must be strong enough that guessing
is hopeless (:func:`strength_problem`: about 128 bits, e.g. 32 random hex digits or
``secrets.token_urlsafe(32)``): the failure budget of :mod:`server.limits.quotas` bounds what refusals cost,
it does not stop guessing. A name is 1 to 64 of ``A-Z a-z 0-9 . _ -``. Only SHA-256 digests are kept
in memory, and a presented key is compared with every stored digest in constant time
(``hmac.compare_digest``), so neither the comparison's time nor a log line says anything of a key.
Problems name the source and line, never its text.

Rotation without downtime: the file is read again on SIGHUP and whenever its modification time,
size or inode changes (checked at most once a second, on the next request); the new set replaces
the old in one assignment, so a request already authenticated is never affected, and a client
moving from an old key to a new one is served throughout when the file holds both during the move.
A reload never fails open: a file with a bad line keeps only the valid keys that were valid before
and are still in the new text (it never adds one, never keeps a removed one); a missing, unreadable
or empty file withdraws all of its keys. Each is one log line; with no key left every request is
refused. At start, any of these refuses to start instead.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("server.door.auth")

KEYS_ENV = "XLNETQA_API_KEYS"
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
CHECK_INTERVAL_S = 1.0  # how often a request may look at the keys file's metadata
MIN_KEY_BITS = 128
KEY_ADVICE = "32 random hex digits, or python -c 'import secrets; print(secrets.token_urlsafe(32))'"
_CHARACTER_CLASSES = (
    ("abcdefghijklmnopqrstuvwxyz", 26),
    ("ABCDEFGHIJKLMNOPQRSTUVWXYZ", 26),
    ("0123456789", 10),
    ("._~+/=-", 7),
)
DENY_ALL = "no valid API key left: the server will deny every request until the keys are fixed"


class KeyFileError(ValueError):
    """The keys could not be read; the message names the source and the line, never a key."""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def strength_problem(key: str) -> str | None:
    """Why ``key`` is too weak to stand alone, or None. An estimate from its length and the character
    classes it uses (at least 128 bits), plus variety: at least 8 distinct characters, none more than a
    quarter of the key (``aaaa...`` and ``abab...`` are long but guessable)."""
    pool = sum(size for chars, size in _CHARACTER_CLASSES if any(c in chars for c in key))
    counts = [key.count(c) for c in set(key)]
    if len(key) * math.log2(max(pool, 2)) < MIN_KEY_BITS or len(counts) < 8 or max(counts) * 4 > len(key):
        return f"a key must carry at least {MIN_KEY_BITS} bits: {KEY_ADVICE}"
    return None


@dataclass
class _Parsed:
    """What one source held: the keys of its good lines, and a line for each bad one."""

    keys: dict[bytes, str]
    problems: list[str]


def _parse_entries(entries: list[tuple[int, str, str]], source: str) -> _Parsed:
    """``(line number, text, name for a bare key)`` entries, already free of comments."""
    parsed = _Parsed({}, [])
    names: set[str] = set()
    for number, line, bare_name in entries:
        name, sep, key = line.partition(":")
        name, key = (name.strip(), key.strip()) if sep else (bare_name, name.strip())
        where = f"{source} line {number}"
        if not KEY_PATTERN.fullmatch(key):
            parsed.problems.append(f"{where}: a key must be 16-256 characters of A-Z a-z 0-9 . _ ~ + / = -")
            continue
        weak = strength_problem(key)
        if weak:
            parsed.problems.append(f"{where}: {weak}")
            continue
        if not NAME_PATTERN.fullmatch(name):
            parsed.problems.append(f"{where}: a key name must be 1-64 characters of A-Z a-z 0-9 . _ -")
            continue
        d = digest(key)
        if d in parsed.keys:
            parsed.problems.append(f"{where}: the same key appears twice")
        elif name in names:
            parsed.problems.append(f"{where}: the name {name!r} appears twice")
        else:
            parsed.keys[d] = name
            names.add(name)
    return parsed


def bare_name(key_text: str) -> str:
    """A bare key's name: ``key-`` and 12 hex digits of its SHA-256, the same wherever the key is."""
    return "key-" + hashlib.sha256(key_text.strip().encode("utf-8")).hexdigest()[:12]


def parse_file_text(text: str, source: str) -> _Parsed:
    """A keys file: comments go per physical line first; then one entry per line."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.append((number, line, bare_name(line)))
    return _parse_entries(entries, source)


def parse_env_text(text: str, source: str = KEYS_ENV) -> _Parsed:
    """The environment variable: entries separated by commas or newlines (no comments)."""
    items = [item.strip() for item in text.replace("\n", ",").split(",")]
    entries = [(n, item, bare_name(item)) for n, item in enumerate((i for i in items if i), start=1)]
    return _parse_entries(entries, f"{source} entry")


def shared_file_problem(
    path: Path, what: str = "the keys file", override: str = "--allow-shared-keys-file"
) -> str | None:
    """Why ``path`` is unsafe for secrets (``what``: keys, a password), or None: other users may read or write it (any permission for
    others; write for its group; read for a group this process is not in). Readable by the process's
    own group is fine (Kubernetes mounts a Secret so, with fsGroup). POSIX modes only."""
    if os.name != "posix":
        return None
    try:
        st = path.stat()
    except OSError:
        return None  # reading it fails with its own message
    mode, own_groups = st.st_mode, {os.getegid(), *os.getgroups()}
    if mode & 0o007 or mode & 0o020:
        who = "writable" if mode & 0o022 else "readable"
    elif mode & 0o040 and st.st_gid not in own_groups:
        who = "readable"
    else:
        return None
    return (
        f"{path}: {what} is {who} by other users (mode {mode & 0o777:04o}): chmod 600 it, or 640 "
        f"with a group of this server's user (or {override})"
    )


def _strict(parsed: _Parsed) -> dict[bytes, str]:
    if parsed.problems:
        raise KeyFileError(parsed.problems[0])
    return parsed.keys


@dataclass(frozen=True)
class _FileStamp:
    mtime_ns: int
    size: int
    inode: int
    mode: int  # a chmod that opens the file to others is a change too

    @classmethod
    def of(cls, path: Path) -> _FileStamp | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return cls(st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)


class KeyRing:
    """The valid keys: loaded at start, reloaded on change or SIGHUP, looked up in constant time."""

    def __init__(
        self, path: Path | None = None, env_text: str | None = None, allow_shared: bool = False
    ) -> None:
        self.path = path
        self.allow_shared = allow_shared
        self._env_keys = _strict(parse_env_text(env_text)) if env_text else {}
        self._file_keys: dict[bytes, str] = {}
        self._keys: dict[bytes, str] = {}
        self._stamp: _FileStamp | None = None
        self._next_check = 0.0
        self._lock = threading.Lock()
        self.reloads = 0
        self.load()  # KeyFileError at start: the server refuses to start

    @classmethod
    def from_settings(
        cls, path: Path | None, env: dict[str, str] | None = None, allow_shared: bool = False
    ) -> KeyRing | None:
        """The configured keys, or None when neither a file nor the variable is given (auth off)."""
        text = (os.environ if env is None else env).get(KEYS_ENV) or None
        if path is None and text is None:
            return None
        return cls(path, text, allow_shared)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys.values()))

    def _read_file(self) -> tuple[_Parsed, _FileStamp | None]:
        """The file's keys and problems (a clash with the variable is one), with the stamp read before."""
        assert self.path is not None
        stamp = _FileStamp.of(self.path)
        shared = shared_file_problem(self.path)
        if shared is not None:
            if not self.allow_shared:
                return _Parsed({}, [shared]), stamp
            logger.warning("%s; accepted because --allow-shared-keys-file is set", shared.split(": chmod")[0])
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return _Parsed({}, [f"{self.path}: cannot read the keys file ({type(exc).__name__})"]), stamp
        parsed = parse_file_text(text, str(self.path))
        env_names = set(self._env_keys.values())
        for d, name in list(parsed.keys.items()):
            if d in self._env_keys or name in env_names:
                del parsed.keys[d]
                parsed.problems.append(f"{self.path}: a key or name is also in {KEYS_ENV}")
        return parsed, stamp

    def _install(self, file_keys: dict[bytes, str], stamp: _FileStamp | None) -> None:
        keys = self._env_keys | file_keys
        with self._lock:  # one assignment: a lookup sees the old set or the new
            self._file_keys, self._keys, self._stamp = file_keys, keys, stamp
            self.reloads += 1

    def load(self) -> None:
        """Read the keys now, strictly (at start): any problem is a KeyFileError and changes nothing."""
        file_keys, stamp = {}, None
        if self.path is not None:
            parsed, stamp = self._read_file()
            file_keys = _strict(parsed)
        if not self._env_keys and not file_keys:
            raise KeyFileError(f"{self.path or KEYS_ENV}: no API keys (auth is on, so nobody could ask)")
        self._install(file_keys, stamp)
        logger.info("API keys loaded: %d (%s)", len(self._keys), ", ".join(self.names))

    def reload(self) -> bool:
        """Reload (SIGHUP, or the file changed), never failing open: a file with problems keeps only
        the keys valid before and still listed; an unreadable or empty one withdraws its keys. One log
        line either way. True when the file was read cleanly."""
        if self.path is None:
            return True
        parsed, stamp = self._read_file()
        if not parsed.keys and not parsed.problems:
            parsed.problems.append(f"{self.path}: no API keys in the file")
        if not parsed.problems:
            self._install(parsed.keys, stamp)
            logger.info("API keys reloaded: %d (%s)", len(self._keys), ", ".join(self.names))
            return True
        kept = {d: name for d, name in parsed.keys.items() if d in self._file_keys}
        self._install(kept, stamp)  # the stamp too: a broken file is not reread every second
        more = f" (and {len(parsed.problems) - 1} more)" if len(parsed.problems) > 1 else ""
        outcome = (
            f"{len(kept)} of its keys stay (valid before and still listed), none added"
            if parsed.keys
            else "its keys are withdrawn"
        )
        left = f"; {DENY_ALL}" if not self._keys else f"; {len(self._keys)} keys valid"
        logger.error("API keys file not fully reloaded: %s%s; %s%s", parsed.problems[0], more, outcome, left)
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


def keys_configured(keys_file: Path | None, env: dict[str, str] | None = None) -> bool:
    """Whether a server with this keys file (and environment) asks for keys: what a process that does not
    check keys itself (the engine) needs to know of them."""
    return keys_file is not None or bool((os.environ if env is None else env).get(KEYS_ENV, "").strip())


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    """The key from ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (the first given)."""
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return key or None
