"""Contexts a caller sends again, tokenized once: SQuAD-style use asks many questions about one
paragraph, and tokenizing it (with character offsets) and indexing its sentences for the answerability
model cost more than the rest of the host path together.

Entries are keyed by the caller and a digest of the context (BLAKE2b, 128 bits), so a hit needs the
same text from the same API key: one tenant can never learn, from a faster answer, that another sent
a text. The cache is bounded in bytes (``--context-cache-mb``), counting what an entry really holds:
its token ids and offsets (24 bytes a token) and, where the model's decision rule reads the context's
sentences, the sentence index and the text it keeps (:data:`INDEX_BYTES_PER_WORD` a word, an upper
bound a test measures: ~3 MB for a 20,000-character context of prose, against its arrays' ~0.2 MB). Least recently used first out, with a per-key share: one caller's
entries may take at most ``key_share`` of the budget (its own oldest go first beyond it), so one
tenant's flood of new contexts evicts its own entries, never more than its share of the others'.
Without API keys every request is the one caller ``anonymous``, who gets the whole budget.
``max_bytes=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from qa_core.squad.answerability_features import ContextIndex

# The sentence index's memory, an upper bound per word and per character of its context
# (tests/test_context_cache.py measures it with tracemalloc on prose, one long word, many short sentences
# and a list of numbers: 460-820 bytes a word, with the word positions, a question's match and verifier
# features, and the word pairs a verifier reading them builds; before the pairs were counted, 640 here).
INDEX_BYTES_PER_WORD = 896
INDEX_BYTES_PER_CHAR = 8
ENTRY_OVERHEAD_BYTES = 512  # the entry's objects and its place in the maps
KEY_SHARE = 0.25  # of the budget, one caller's at most when the server has API keys


@dataclass(eq=False)
class EncodedContext:
    """One context's tokens and offsets, and (where the decision rule reads it) its sentence index."""

    ids: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n, 2], characters of the context
    _index: ContextIndex | None = field(default=None, repr=False)

    @classmethod
    def of(cls, ids: np.ndarray, offsets: np.ndarray, context: str, indexed: bool) -> EncodedContext:
        """An entry, with its sentence index built now when ``indexed`` (so its size is known once kept)."""
        return cls(ids, offsets, ContextIndex(context) if indexed else None)

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])

    @property
    def nbytes(self) -> int:
        """What keeping this entry costs, the sentence index's upper bound included."""
        size = int(self.ids.nbytes + self.offsets.nbytes) + ENTRY_OVERHEAD_BYTES
        if self._index is not None:
            text = self._index.context
            size += sys.getsizeof(text) + INDEX_BYTES_PER_CHAR * len(text)
            size += INDEX_BYTES_PER_WORD * self._index.word_count
        return size

    def index(self, context: str) -> ContextIndex:
        """The context's :class:`ContextIndex`, built on first use if it was not built with the entry."""
        if self._index is None:
            self._index = ContextIndex(context)
        return self._index


def context_key(caller: str, context: str) -> bytes:
    """The cache key: the caller's name and the context, digested (the text itself is not the key)."""
    digest = hashlib.blake2b(digest_size=16, person=b"xlnetqa-context")
    digest.update(caller.encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(context.encode("utf-8", "surrogatepass"))
    return digest.digest()


class ContextCache:
    """A thread-safe LRU of :class:`EncodedContext` bounded in bytes, each caller to ``key_share`` of
    them (see the module docstring)."""

    def __init__(self, max_bytes: int = 32 << 20, key_share: float = 1.0) -> None:
        if not 0.0 < key_share <= 1.0:
            raise ValueError("key_share is a fraction of the cache, in (0, 1]")
        self.max_bytes, self.key_share = max_bytes, key_share
        self._entries: OrderedDict[bytes, tuple[EncodedContext, str, int]] = OrderedDict()
        self._by_caller: dict[str, OrderedDict[bytes, None]] = {}
        self._caller_bytes: dict[str, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def per_caller(self) -> int:
        """The most one caller's entries may hold, in bytes."""
        return int(self.max_bytes * self.key_share)

    def get(self, key: bytes) -> EncodedContext | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            entry, caller, _ = found
            self._entries.move_to_end(key)
            self._by_caller[caller].move_to_end(key)
            self.hits += 1
            return entry

    def put(self, caller: str, key: bytes, entry: EncodedContext) -> None:
        """Keep ``entry`` for ``caller`` (one larger than the caller's share is not kept)."""
        size = entry.nbytes
        if size > self.per_caller:
            return
        with self._lock:
            self._drop(key)
            own = self._by_caller.setdefault(caller, OrderedDict())
            while own and self._caller_bytes.get(caller, 0) + size > self.per_caller:
                self._drop(next(iter(own)))  # over its share: the caller's own oldest entries go
            self._entries[key] = (entry, caller, size)
            self._by_caller.setdefault(caller, OrderedDict())[key] = None
            self._caller_bytes[caller] = self._caller_bytes.get(caller, 0) + size
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: bytes) -> None:
        found = self._entries.pop(key, None)
        if found is None:
            return
        _, caller, size = found
        self._bytes -= size
        own = self._by_caller[caller]
        del own[key]
        self._caller_bytes[caller] -= size
        if not own:
            del self._by_caller[caller], self._caller_bytes[caller]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes the entries hold (by the same count the bound uses)."""
        return self._bytes

    def held_by(self, caller: str) -> int:
        """Bytes ``caller``'s entries hold."""
        with self._lock:
            return self._caller_bytes.get(caller, 0)
