"""Connections before the door: what a client that has shown no valid key may hold.

A connection is *unvouched* from its accept until a request on it passes the door (a valid API key, or
any request when the server has no keys). Unvouched connections cost a slot of ``--max-connections``
and nothing else, so a keyless client could hold every slot, sending nothing and reconnecting as the
header deadline closes them, and a key holder would find none free. Two rules bound them:

- **Per address**: at most ``per_address`` unvouched connections from one client address at once; a
  new one over it closes that address's oldest *idle* unvouched connection (no request in progress).
  The newcomer is never the one refused: behind a proxy or NAT every client shares the flood's address,
  and a client's new connection must still get in.
- **Room for newcomers**: when accepting a connection would fill the pool, the oldest idle unvouched
  connection of any address is closed to make room.

A flood of idle connections therefore only ever displaces itself: a key holder's new connection gets a
slot, is the newest, and is vouched by its first request (a millisecond later) long before enough newer
connections could age it out. Vouched connections are never closed here.

Plain bookkeeping with no I/O: :mod:`server.connection` calls it and closes what it names.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Protocol, TypeVar


class PoolMember(Protocol):
    @property
    def idle(self) -> bool:
        """No request in progress on it (so closing it cuts no request short)."""
        ...


C = TypeVar("C", bound=PoolMember)


class DoorPool:
    """Unvouched connections, oldest first, and how many each address holds."""

    def __init__(self) -> None:
        self._unvouched: OrderedDict[object, str] = OrderedDict()
        self._by_address: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._unvouched)

    def holds(self, address: str) -> int:
        return self._by_address[address]

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

    def vouch(self, connection: object) -> None:
        """A request on ``connection`` passed the door: it is a client's, not the flood's."""
        self.forget(connection)

    def forget(self, connection: object) -> None:
        address = self._unvouched.pop(connection, None)
        if address is not None:
            self._by_address[address] -= 1
            if self._by_address[address] <= 0:
                del self._by_address[address]

    def make_room(self, connections: int, limit: int | None, newcomer: object) -> list[C]:
        """The idle unvouched connections to close (oldest first, never ``newcomer``) so that
        ``connections`` (all of them, vouched and not) stays under ``limit``."""
        if limit is None or connections < limit:
            return []
        evict: list[C] = []
        for connection in self._unvouched:
            if connections - len(evict) < limit:
                break
            if connection is not newcomer and connection.idle:  # type: ignore[attr-defined]
                evict.append(connection)  # type: ignore[arg-type]
        for connection in evict:
            self.forget(connection)
        return evict
