"""Write a directory atomically: build it in a temporary sibling, then rename it into place (torch-free).

Readers (a server watching the export path) see the old directory or the new one, never half of one;
a failure leaves the old one untouched. Permissions follow the umask like `mkdir` (not mkdtemp's 0700),
so a server running as another user can read the export.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside `target`; on success it replaces `target`."""
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
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
