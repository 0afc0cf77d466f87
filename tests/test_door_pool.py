"""Who holds the connections (server/door/pool.py) on its own: plain bookkeeping with stand-in
connections that are idle or busy. Unvouched connections per address, vouched ones per key, and which
ones make room when the pool is full: never a busy one, never the newcomer, the keyless first, then
the key holding the most. (The same rules against real floods: tests/test_server_key_floods.py.)"""

from __future__ import annotations

from dataclasses import dataclass

from server.door.pool import DoorPool


@dataclass(eq=False)
class Conn:
    name: str
    idle: bool = True


def names(connections: list) -> list[str]:
    return [c.name for c in connections]


def test_an_address_over_its_cap_loses_its_oldest_idle_connection_never_the_newcomer() -> None:
    pool = DoorPool()
    a, b, busy = Conn("a"), Conn("b"), Conn("busy", idle=False)
    assert pool.accept(busy, "10.0.0.1", per_address=2) == []
    assert pool.accept(a, "10.0.0.1", per_address=2) == []
    newcomer = Conn("new")
    assert names(pool.accept(newcomer, "10.0.0.1", per_address=2)) == ["a"]  # busy is skipped
    assert pool.holds("10.0.0.1") == 2
    assert pool.accept(b, "10.0.0.2", per_address=2) == []  # another address is counted apart


def test_a_key_over_its_cap_loses_its_oldest_idle_connection() -> None:
    pool = DoorPool()
    first, second, third = Conn("first"), Conn("second"), Conn("third")
    for c in (first, second, third):
        pool.accept(c, "10.0.0.1", per_address=None)
    assert pool.vouch(first, "flood", per_key=2) == []
    assert pool.vouch(second, "flood", per_key=2) == []
    assert names(pool.vouch(third, "flood", per_key=2)) == ["first"]
    assert pool.held_by_key("flood") == 2 and len(pool) == 0


def test_room_is_made_from_the_keyless_first_then_from_the_key_holding_the_most() -> None:
    pool = DoorPool()
    flood = [Conn(f"f{k}") for k in range(3)]
    tenant = Conn("t0")
    keyless = Conn("keyless")
    for c in (*flood, tenant, keyless):
        pool.accept(c, "10.0.0.1", per_address=None)
    for c in flood:
        pool.vouch(c, "flood", per_key=None)
    pool.vouch(tenant, "tenant", per_key=None)
    newcomer = Conn("new")
    pool.accept(newcomer, "10.0.0.9", per_address=None)
    # 6 connections with a limit of 6: one must go, and the keyless idle one goes first
    assert names(pool.make_room(6, 6, newcomer)) == ["keyless"]
    # then the key holding the most loses its oldest idle ones, as long as it holds the most
    assert names(pool.make_room(7, 6, newcomer)) == ["f0", "f1"]
    flood[2].idle = False  # busy: the next largest key gives its idle one instead
    assert names(pool.make_room(6, 6, newcomer)) == ["t0"]
    assert pool.make_room(6, 6, newcomer) == []  # nothing idle is left anywhere
    assert pool.held_by_key("flood") == 1


def test_a_vouched_connection_reused_by_another_key_moves_to_that_key() -> None:
    pool = DoorPool()
    c = Conn("c")
    pool.accept(c, "10.0.0.1", per_address=None)
    pool.vouch(c, "a", per_key=None)
    pool.vouch(c, "b", per_key=None)
    assert (pool.held_by_key("a"), pool.held_by_key("b")) == (0, 1)
    pool.forget(c)
    assert pool.held_by_key("b") == 0


def test_a_connection_closed_while_its_request_waited_at_the_door_is_not_counted_again() -> None:
    """The door vouches after awaiting the key's limits (a round trip to the engine or Redis): a
    connection closed meanwhile was forgotten, and must not come back as the key's."""
    pool = DoorPool()
    gone = Conn("gone", idle=False)
    pool.accept(gone, "10.0.0.1", per_address=None)
    pool.forget(gone)  # connection_lost while the limits were checked
    assert pool.vouch(gone, "flood", per_key=1) == []
    assert pool.held_by_key("flood") == 0 and len(pool) == 0
