"""sha256 digests of files and bytes: one home for how the project fingerprints what it writes and reads
(export sidecars and the files they serve, prepared corpus shards). Torch-free, stdlib only."""

from __future__ import annotations

import hashlib
import os


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks (weights files and shards are hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
