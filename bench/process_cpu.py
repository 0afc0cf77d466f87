"""CPU time of a server's processes by role, from /proc (Linux): what one request costs each kind of
process, the numbers a model of more cores is built from.

Roles: ``engine`` (``python -m server.topology.engine``), ``front`` (uvicorn's worker processes), ``server``
(the ``python -m server`` process itself: the whole server when it runs in one process, else the
supervisor, which does nearly nothing).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float, bytes] | None:
    """(parent pid, CPU seconds, command line) of ``pid``, or None when it is gone or unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, cmdline


def role_of(cmdline: bytes) -> str:
    if b"server.topology.engine" in cmdline:
        return "engine"
    if b"spawn_main" in cmdline or b"multiprocessing" in cmdline:
        return "front"
    return "server"


def cpu_seconds_by_role(root: int) -> dict[str, float]:
    """CPU seconds so far of ``root`` and its descendants, summed by role (empty off Linux)."""
    if not Path("/proc").is_dir():
        return {}
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    out: dict[str, float] = defaultdict(float)

    def descends(pid: int) -> bool:
        for _ in range(64):
            if pid == root:
                return True
            stat = stats.get(pid)
            if stat is None or stat[0] <= 1:
                return False
            pid = stat[0]
        return False

    for pid, (_, seconds, cmdline) in stats.items():
        if descends(pid):
            out["server" if pid == root else role_of(cmdline)] += seconds
    return dict(out)
