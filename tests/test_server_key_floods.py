"""Floods that hold connection slots beside a key holder, against real uvicorn on 127.0.0.1: one valid key
holding twice --max-connections keep-alive connections (with a keyed probe, or a keyed request, on each
every 3.5 s), and keyless requests from 16 addresses that declare a body of 1,000,000 bytes and send none
(their refusal would wait for it). Another key's new connections must be served, >= 99% of them: a
probe or a refusal never vouches for a connection, a key holds at most a quarter of the slots, the idle
connections of the key holding the most make room, and a refusal reading a body counts as idle and
lingers only for an address within its failure budget while the pool has room (bench.abuse --flood
reports the same floods, where the server before these rules served none)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from auth_helpers import ALICE, BOB, keys_file
from server_helpers import ServerProcess

from bench.flood_scenarios import flood_setup, key_holder
from bench.floods import flood_process


@pytest.mark.parametrize("name", ["key-probes", "key-requests", "lingering"])
def test_slots_held_by_one_key_or_by_lingering_refusals_leave_another_key_served(
    onnx_export: Path, tmp_path: Path, name: str
) -> None:
    keys = keys_file(tmp_path / "keys.txt", f"alice: {ALICE}", f"bob: {BOB}")
    setup = flood_setup(name, tmp_path)
    server = ServerProcess(onnx_export, tmp_path, "--api-keys-file", str(keys), *setup.flags)
    with server as s, flood_process(*setup.flood(s.url, s.port, ALICE)) as flood:
        time.sleep(3.0)  # the flood holds or churns through every slot it can
        flooded = key_holder(s.url, BOB, 100)
    outcomes = [o for o, _ in flooded]
    assert outcomes.count("200") >= 99, [o for o in outcomes if o != "200"][:5]
    if name == "lingering":  # refused before the door's app, never served
        assert flood.tally.get("401", 0) + flood.tally.get("429", 0) > 100, flood.tally
    else:  # the flood's key was served too: it was let in, and held connections
        assert flood.tally.get("opened", 0) >= 150 and flood.tally.get("200", 0) >= 150, flood.tally
