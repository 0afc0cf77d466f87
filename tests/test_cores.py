"""The default thread count is the cores this process may use: its affinity, within its cgroup's CPU
quota (a container limited to two CPUs on a large host gets two, not the host's count), OMP_NUM_THREADS
first; the server takes it when --threads is not given, and its onnxruntime threads do not spin."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from paths import REPO
from server_helpers import ServerProcess

from qa_core.runtime.cores import MAX_DEFAULT_THREADS, available_cores, default_threads
from qa_core.runtime.sessions import session

SHIPPED = REPO / "models" / "squad2-small-int8"
AFFINITY = len(os.sched_getaffinity(0))


def cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "max 100000\n"}, AFFINITY),  # v2, no quota
        ({"cpu.max": "100000 100000\n"}, 1),  # v2, one CPU
        ({"cpu.max": "50000 100000\n"}, 1),  # half a CPU rounds up to one thread
        ({"cpu.max": "15000000 100000\n"}, AFFINITY),  # a quota above the affinity: the affinity
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, AFFINITY),  # v1, none
        ({"cpu.max": "garbage\n"}, AFFINITY),  # unreadable: no quota assumed
        ({}, AFFINITY),  # no cgroup files at all
    ],
)
def test_the_cores_are_the_affinity_within_the_quota(tmp_path: Path, files: dict, expected: int) -> None:
    assert available_cores(cgroup(tmp_path, files)) == expected


def test_omp_num_threads_comes_first_then_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert default_threads() == min(MAX_DEFAULT_THREADS, available_cores())


def test_server_sessions_do_not_spin() -> None:
    model = SHIPPED / "model.onnx"
    quiet, spinning = session(model, threads=2, spinning=False), session(model, threads=2)
    key = "session.intra_op.allow_spinning"
    assert quiet.get_session_options().get_session_config_entry(key) == "0"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # onnxruntime's default: spin
        spinning.get_session_options().get_session_config_entry(key)


def test_the_server_runs_on_the_cores_unless_told(tmp_path: Path) -> None:
    expected = min(MAX_DEFAULT_THREADS, available_cores())
    with ServerProcess(SHIPPED, tmp_path, env={"OMP_NUM_THREADS": ""}) as s:
        runtime = httpx.get(s.url + "/v1/model", timeout=30).json()["runtime"]
        assert runtime["intra_op_threads"] == expected
    with ServerProcess(SHIPPED, tmp_path, "--threads", "1", env={"OMP_NUM_THREADS": ""}) as s:
        assert httpx.get(s.url + "/v1/model", timeout=30).json()["runtime"]["intra_op_threads"] == 1
