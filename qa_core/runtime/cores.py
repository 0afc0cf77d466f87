"""How many cores this process may use, and so how many threads a model should run on by default.

``os.cpu_count()`` is the machine's count, not this process's: in a container limited to two CPUs on a
64-core host it says 64, and a model running 64 threads there is throttled by the quota. The count here
is the smallest of the CPUs this process may run on (its affinity, which cpusets set) and its cgroup's
CPU quota (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), rounded up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
MAX_DEFAULT_THREADS = 8  # beyond this a single request's windows gain little from more intra-op threads


def _quota(root: Path) -> float | None:
    """CPUs the cgroup quota allows (None: no quota, or none readable)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # v2: "max 100000" or "200000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # v1
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def available_cores(cgroup_root: Path = CGROUP) -> int:
    """The cores this process may use: its affinity, within its cgroup's CPU quota (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = _quota(cgroup_root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def default_threads() -> int:
    """OMP_NUM_THREADS when set (tests and shared machines), else the cores this process may use, at
    most MAX_DEFAULT_THREADS."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else min(MAX_DEFAULT_THREADS, available_cores())
