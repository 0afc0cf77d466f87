"""The SDK as a distribution of its own (clients/pyproject.toml): ``pip wheel ./clients`` gives a wheel
holding the one top-level package ``clients`` and requiring httpx and pydantic only; installed into a
fresh virtual environment (nothing of this repository on its path), it answers through a real server
with the SDK's own example, sync and async, typed errors included, and nothing of the server, the
model or training can be imported there. Needs the package index (CI has it) for httpx and pydantic."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from server_helpers import ServerProcess

import clients
from harness.server_process import REPO

NOT_THERE = (
    "qa_core",
    "train",
    "export",
    "server",
    "bench",
    "harness",
    "numpy",
    "sentencepiece",
    "torch",
    "fastapi",
)


def build_wheel(work: Path) -> Path:
    """The SDK's wheel, built from a copy of clients/ (the build writes beside its sources)."""
    shutil.copytree(
        REPO / "clients", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    )
    out = work / "wheels"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
        str(work / "src"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def test_the_sdk_wheel_holds_clients_alone_and_works_from_a_fresh_venv(
    onnx_export: Path, tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"clients"}
    requires = sorted(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)", metadata, re.M))
    assert requires == ["httpx", "pydantic"], requires

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True, timeout=600
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]

    example = re.search(r"```python\n(.*?)```", clients.__doc__ or "", re.S)
    assert example is not None
    isolation = (
        "import importlib.util, clients\n"
        f"assert clients.__file__.startswith({str(env_dir)!r}), clients.__file__\n"
        f"missing = [m for m in {NOT_THERE!r} if importlib.util.find_spec(m) is not None]\n"
        "assert not missing, missing\n"
    )
    with ServerProcess(onnx_export, tmp_path) as s:
        source = isolation + example.group(1).replace("http://127.0.0.1:8000", s.url)
        r = subprocess.run([str(python), "-c", source], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "422" in r.stdout and "shallow" in r.stdout  # the typed error and the model's head, as in-tree
