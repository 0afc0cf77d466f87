"""Directories that appear whole or not at all (torch-free): build in a temporary sibling, fsync, rename.

Readers (a server watching an export path, a resume reading a checkpoint) see the old directory or the
new one, never half of one; a failure or a kill leaves the old one untouched and at most a temporary
``.NAME.tmp-*`` sibling (or, killed between the two renames of a swap, the old one as ``.NAME.old-*``),
which :func:`recover_interrupted` cleans up or puts back. Permissions follow the umask like ``mkdir`` (not
mkdtemp's 0700), so a server running as another user can read the result.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def fsync_directory(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in ``path`` durable (a file's fsync does not cover its directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; on success it replaces ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for path in tmp.rglob("*"):  # make the bytes durable before the rename makes them visible
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        elif path.is_dir():
            fsync_directory(path)
    fsync_directory(tmp)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(tmp, target)
    fsync_directory(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace the file ``path`` with ``data`` durably: a temporary sibling, fsynced, renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def recover_interrupted(folder: str | os.PathLike) -> list[Path]:
    """Clean up after writes in ``folder`` that a kill interrupted: temporary siblings are removed; a
    swap interrupted between its two renames (``.NAME.old-PID`` kept, ``NAME`` gone) is put back, and
    the old copy is deleted only when its replacement is in place. Returns what was removed."""
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        if not entry.name.startswith("."):
            continue
        if ".old-" in entry.name:
            original = folder / entry.name[1:].rsplit(".old-", 1)[0]
            if not original.exists():
                os.replace(entry, original)
                continue
        elif ".tmp-" not in entry.name:
            continue
        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed
