"""Contexts a caller sends again, tokenized once: SQuAD-style use asks many questions about one
paragraph, and tokenizing it (with character offsets) and indexing its sentences for the answerability
model cost more than the rest of the host path together.

Entries are keyed by the caller and a digest of the context (BLAKE2b, 128 bits), so a hit needs the
same text from the same API key: one tenant can never learn, from a faster answer, that another sent
a text. The cache is a least-recently-used map bounded by the tokens it holds (offsets and ids are
~24 bytes a token, so the default 262,144 tokens is ~6 MB), shared by every caller; a flood of new
contexts only evicts, it never grows memory. ``max_tokens=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from train.squad.answerability_features import ContextIndex


@dataclass(eq=False)
class EncodedContext:
    """One context's tokens and offsets, and (once a decision needed it) its sentence index."""

    ids: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n, 2], characters of the context
    _index: ContextIndex | None = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])

    def index(self, context: str) -> ContextIndex:
        """The context's :class:`ContextIndex`, built on first use (only lexical decision rules need it)."""
        if self._index is None:
            self._index = ContextIndex(context)
        return self._index


def context_key(caller: str, context: str) -> bytes:
    """The cache key: the caller's name and the context, digested (the text itself is not kept)."""
    digest = hashlib.blake2b(digest_size=16, person=b"xlnetqa-context")
    digest.update(caller.encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(context.encode("utf-8", "surrogatepass"))
    return digest.digest()


class ContextCache:
    """A thread-safe LRU of :class:`EncodedContext` bounded in tokens (see the module docstring)."""

    def __init__(self, max_tokens: int = 262144) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[bytes, EncodedContext] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> EncodedContext | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: bytes, entry: EncodedContext) -> None:
        """Keep ``entry`` (a context longer than the whole cache is not kept)."""
        if entry.tokens > self.max_tokens:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._tokens -= old.tokens
            self._entries[key] = entry
            self._tokens += entry.tokens
            while self._tokens > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self._tokens -= evicted.tokens

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens
