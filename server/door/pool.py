"""Who holds the server's connections: what a client that has shown no valid key may hold, and what one
key may hold.

A connection is *unvouched* from its accept until a request on it passes the door (a valid API key
within its limits, or any request when the server has no keys); probes (``/healthz``, ``/readyz``)
and refused requests never vouch. Unvouched connections cost a slot of ``--max-connections`` and
nothing else, so a keyless client could hold every slot, sending nothing and reconnecting as the
header deadline closes them, and a key holder would find none free. A vouched connection belongs to
its key, and one key could hold every slot the same way (a keyed probe every few seconds on thousands
of keep-alive connections). The rules:

- **Per address**: at most ``per_address`` unvouched connections from one client address at once; a
  new one over it closes that address's oldest *idle* unvouched connection (no request in progress).
  The newcomer is never the one refused: behind a proxy or NAT every client shares the flood's address,
  and a client's new connection must still get in.
- **Per key**: at most ``per_key`` connections vouched by one key; a request that vouches one more
  closes that key's oldest idle connection.
- **Room for newcomers**: when accepting a connection would fill the pool, the oldest idle unvouched
  connection of any address is closed to make room; if there is none, the oldest idle connection of
  the key holding the most.

A refusal that is still reading the refused body (so that the client sees the answer, not a reset)
counts as idle here: closing it cuts nothing the client is owed. A flood of idle connections therefore
only ever displaces itself, keyless or keyed: a key holder's new connection gets a slot, is the newest,
and is vouched by its first request (a millisecond later) long before enough newer connections could
age it out.

Plain bookkeeping with no I/O: :mod:`server.door.connection` calls it and closes what it names.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Protocol, TypeVar


class PoolMember(Protocol):
    @property
    def idle(self) -> bool:
        """No request in progress on it (so closing it cuts no request short)."""
        ...


C = TypeVar("C", bound=PoolMember)


class DoorPool:
    """Unvouched connections (oldest first, and how many each address holds) and vouched ones by key."""

    def __init__(self) -> None:
        self._unvouched: OrderedDict[object, str] = OrderedDict()
        self._by_address: Counter[str] = Counter()
        self._by_key: dict[str, OrderedDict[object, None]] = {}  # oldest first
        self._key_of: dict[object, str] = {}

    def __len__(self) -> int:
        return len(self._unvouched)

    def holds(self, address: str) -> int:
        """Unvouched connections ``address`` holds."""
        return self._by_address[address]

    def held_by_key(self, key: str) -> int:
        """Connections ``key`` vouched for."""
        return len(self._by_key.get(key, ()))

    def accept(self, connection: C, address: str, per_address: int | None) -> list[C]:
        """Count a new connection; returns the same address's idle unvouched connections to close
        (oldest first, never ``connection``) when it holds more than ``per_address``."""
        self._unvouched[connection] = address
        self._by_address[address] += 1
        if per_address is None or self._by_address[address] <= per_address:
            return []
        over = self._by_address[address] - per_address
        evict = [
            c for c, a in self._unvouched.items()
            if a == address and c is not connection and c.idle  # type: ignore[attr-defined]
        ][:over]  # fmt: skip
        for c in evict:
            self.forget(c)
        return evict  # type: ignore[return-value]

    def vouch(self, connection: C, key: str, per_key: int | None) -> list[C]:
        """A request of ``key`` on ``connection`` passed the door: it is that key's now. Returns the
        key's idle connections to close (oldest first, never ``connection``) beyond ``per_key``. A
        connection the pool no longer knows (closed while its request waited at the door) is left out."""
        if connection not in self._unvouched and connection not in self._key_of:
            return []
        self.forget(connection)
        own = self._by_key.setdefault(key, OrderedDict())
        own[connection] = None
        self._key_of[connection] = key
        if per_key is None or len(own) <= per_key:
            return []
        over = len(own) - per_key
        evict = [c for c in own if c is not connection and c.idle][:over]  # type: ignore[attr-defined]
        for c in evict:
            self.forget(c)
        return evict  # type: ignore[return-value]

    def forget(self, connection: object) -> None:
        address = self._unvouched.pop(connection, None)
        if address is not None:
            self._by_address[address] -= 1
            if self._by_address[address] <= 0:
                del self._by_address[address]
        key = self._key_of.pop(connection, None)
        if key is not None:
            own = self._by_key[key]
            own.pop(connection, None)
            if not own:
                del self._by_key[key]

    def make_room(self, connections: int, limit: int | None, newcomer: object) -> list[C]:
        """The idle connections to close (never ``newcomer``) so that ``connections`` (all of them)
        stays under ``limit``: unvouched ones first, oldest first; then those of the key holding the
        most, oldest first."""
        if limit is None or connections < limit:
            return []
        need = connections - limit + 1
        evict = _idle(self._unvouched, newcomer, need)
        for c in evict:
            self.forget(c)
        while len(evict) < need:
            # one at a time from the key holding the most (the largest changes as they go); a key whose
            # connections are all busy has none to give, and the next largest is asked
            keys = sorted(self._by_key, key=lambda k: len(self._by_key[k]), reverse=True)
            taken = next((found for k in keys if (found := _idle(self._by_key[k], newcomer, 1))), None)
            if taken is None:
                break  # nothing idle anywhere
            self.forget(taken[0])
            evict.extend(taken)
        return evict  # type: ignore[return-value]


def _idle(connections: Iterable[object], newcomer: object, n: int) -> list[object]:
    """Up to ``n`` idle connections of ``connections``, oldest first, never ``newcomer``."""
    found: list[object] = []
    for c in connections:
        if len(found) == n:
            break
        if c is not newcomer and c.idle:  # type: ignore[attr-defined]
            found.append(c)
    return found
