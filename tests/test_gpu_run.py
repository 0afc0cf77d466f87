"""bench.gpu_run on the CPU: the parts a large wheel travels in come back byte for byte (or the missing
and damaged ones are named), a carried wheelhouse installs into a target directory, the plan of calls
carries every part once and runs every stage once in a workable order, and the stages themselves run
on tiny shapes with ``--device cpu`` (the GPU-only configurations say why they did not run)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from paths import REPO
from server_helpers import server_env

from bench.gpu_run import OUT, STAGES_AFTER_INSTALL, STAGES_BEFORE_INSTALL, main, plan_runs
from bench.wheel_parts import PartsError, find_manifest, join, load_manifest, split, wheelhouse


def test_split_and_join_give_back_the_same_bytes(tmp_path: Path) -> None:
    data = os.urandom(2_500_000)
    original = tmp_path / "big.whl"
    original.write_bytes(data)
    assert main(["split", str(original), str(tmp_path / "parts"), "--part-mib", "1"]) == 0
    manifest = find_manifest(tmp_path / "parts")
    parts = load_manifest(manifest)["parts"]
    assert [p["size"] for p in parts] == [1 << 20, 1 << 20, 2_500_000 - 2 * (1 << 20)]
    assert [p["file"] for p in parts] == ["big.whl.part01", "big.whl.part02", "big.whl.part03"]
    assert main(["join", str(tmp_path / "parts"), str(tmp_path / "joined.whl")]) == 0
    assert (tmp_path / "joined.whl").read_bytes() == data
    exact = split(original, tmp_path / "exact", len(data))  # one part holding it all
    assert len(load_manifest(exact)["parts"]) == 1 and join(exact, tmp_path / "one").read_bytes() == data


def test_missing_and_damaged_parts_are_named_before_anything_is_written(tmp_path: Path, capsys) -> None:
    original = tmp_path / "big.whl"
    original.write_bytes(os.urandom(300_000))
    manifest = split(original, tmp_path / "parts", 100_000)
    (tmp_path / "parts" / "big.whl.part02").unlink()
    damaged = tmp_path / "parts" / "big.whl.part03"
    data = damaged.read_bytes()
    damaged.write_bytes(
        bytes([data[0] ^ 0xFF]) + data[1:]
    )  # a first byte that differs (b"x" was it 1 in 256 times)
    with pytest.raises(PartsError) as exc:
        join(manifest, tmp_path / "joined.whl")
    assert str(exc.value) == (
        "big.whl: part 2 of 3 (big.whl.part02) is missing; part 3 of 3 (big.whl.part03) is damaged (SHA-256 differs)"
    )
    assert not (tmp_path / "joined.whl").exists()
    assert main(["join", str(tmp_path / "parts"), str(tmp_path / "joined.whl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m bench.gpu_run join: error: big.whl: part 2 of 3")
    assert main(["parts", str(tmp_path / "nothing")]) == 0  # the status line, not an error
    assert "no *.parts.json manifest(s)" in capsys.readouterr().out


def tiny_wheel(
    directory: Path, name: str = "gpurun_probe", version: str = "0.1", extra: dict[str, bytes] | None = None
) -> Path:
    """A minimal valid wheel holding one module, ``{name}.VALUE == 42`` (and ``extra`` files)."""
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        **(extra or {}),
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = f"{name}-{version}.dist-info/RECORD"
    lines = []
    for path, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(content)}")
    files[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, content in files.items():
            zf.writestr(path, content)
    return wheel


@pytest.fixture
def carried_parts(tmp_path: Path) -> Path:
    """A wheelhouse of one tiny wheel, in parts of 1 KiB, as `pack` makes them."""
    tar = wheelhouse([tiny_wheel(tmp_path / "wheels")], tmp_path / "gpu-wheels-test.tar")
    split(tar, tmp_path / "parts", 1024)
    return tmp_path / "parts"


def test_a_carried_wheelhouse_installs_into_a_target_directory(carried_parts: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    assert main(["install", str(carried_parts), str(target)]) == 0
    proc = subprocess.run(
        [sys.executable, "-c", "import gpurun_probe; print(gpurun_probe.VALUE)"],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() == "42", proc.stderr


@pytest.mark.parametrize("n_parts", [1, 2, 5])
def test_the_plan_carries_each_part_once_and_runs_each_stage_once_in_order(n_parts: int) -> None:
    manifest = {"file": "w.tar", "parts": [{"file": f"w.tar.part{k:02d}"} for k in range(1, n_parts + 1)]}
    runs = plan_runs(".gpu-parts", manifest)
    assert len(runs) == n_parts + 2  # one call per part, then the servers and graphs, then the tests
    carried = [path for r in runs for path in r.carry if ".part" in path and not path.endswith(".json")]
    assert carried == [f".gpu-parts/w.tar.part{k:02d}" for k in range(1, n_parts + 1)]
    assert all(".gpu-parts/w.tar.parts.json" in r.carry for r in runs[:n_parts])
    assert all(r.carry == () for r in runs[n_parts:])
    stages = [
        s
        for r in runs
        if " stages " in r.command
        for s in r.command.split(" stages ")[1].split(" --out")[0].split()
    ]
    every = [s for group in (*STAGES_BEFORE_INSTALL, *STAGES_AFTER_INSTALL) for s in group]
    assert sorted(stages) == sorted(every)  # each exactly once
    # the image has no fastapi / uvicorn / pydantic: whatever serves or imports the server waits for them
    needs_server = (
        "latency-torch",
        "serve-torch",
        "graphs",
        "latency-ort",
        "serve-ort",
        "gpu-test",
        "gpu-check",
    )
    assert stages.index("install") < min(stages.index(s) for s in needs_server)
    assert stages[-1] == "report"
    install_call = next(r for r in runs if "install" in r.command)
    assert install_call is runs[n_parts - 1]  # the call that brings the last part
    # ... measures the onnxruntime-CUDA rows beside the torch rows first
    first = install_call.command.split(" stages ")[1].split()[:3]
    assert first == ["install", "latency-torch", "latency-ort"]
    assert all(r.timeout_s <= 600 and len(r.command) < 2000 for r in runs)
    # results stay on the warm machine and come back as one archive (a call returns at most 8 files)
    assert all(OUT in r.command and "$OUT/" in r.command for r in runs if " stages " in r.command)


def test_the_stages_before_install_import_nothing_the_image_lacks() -> None:
    """The lent machine's image has no fastapi / uvicorn / pydantic ... until `install`: each module a
    stage before it runs is imported with those packages made unimportable."""
    from bench.gpu_stages import STAGE_MODULES

    blocked = ("fastapi", "uvicorn", "starlette", "pydantic", "pydantic_settings", "httptools", "uvloop")
    blocked += ("orjson", "zmq", "msgspec", "opentelemetry")
    modules = [STAGE_MODULES[s] for group in STAGES_BEFORE_INSTALL for s in group]
    code = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}: raise ImportError('the image lacks ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for m in {modules!r}: __import__(m)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # and the check has teeth: the latency stage does import the server (so it runs after install)
    late = code.replace(f"for m in {modules!r}", f"for m in {[STAGE_MODULES['latency-torch']]!r}")
    proc = subprocess.run([sys.executable, "-c", late], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "the image lacks" in proc.stderr


def test_parts_fit_one_call_beside_the_tree(tmp_path: Path) -> None:
    """A part's size comes from the tree's real size; a plan whose calls would overflow says which."""
    from bench.gpu_run import CALL_LIMIT_MIB, MIB, Run, carried_tree_bytes, oversized_calls, part_mib_for

    tree = carried_tree_bytes(REPO)
    assert 1 * MIB < tree < 40 * MIB  # the tracked tree (plus untracked, not ignored files)
    part = part_mib_for(tree)
    assert (part + 2) * MIB + tree <= CALL_LIMIT_MIB * MIB < (part + 4) * MIB + tree
    with pytest.raises(PartsError, match="leaving"):
        part_mib_for(60 * MIB)
    (tmp_path / "fits").write_bytes(b"x" * (part * MIB))
    (tmp_path / "too-big").write_bytes(b"x" * ((CALL_LIMIT_MIB + 1) * MIB - tree))
    runs = [Run(("fits",), "true", 60), Run(("too-big",), "true", 60)]
    assert oversized_calls(tmp_path, runs, tree) == [
        f"call 2 carries {CALL_LIMIT_MIB + 1:.1f} MiB (the tree {tree / MIB:.1f} MiB)"
    ]


def test_a_pruned_wheel_keeps_a_valid_record_and_travels_xz(tmp_path: Path) -> None:
    """--prune-tool rewrites the CUDA provider library inside the wheel (here a stand-in tool that zeroes
    the second half, as the real one zeroes the other archs' code), updates its RECORD hash, stores it
    uncompressed, and the xz wheelhouse then carries the zeros for almost nothing; pip installs it."""
    from bench.gpu_run import CUDA_PROVIDER_LIBRARY, pruned_wheel

    name = "onnxruntime_gpu"
    lib = f"{name}/capi/{CUDA_PROVIDER_LIBRARY}"
    content = os.urandom(200_000)
    wheel = tiny_wheel(tmp_path / "wheels", name=name, version="1.0", extra={lib: content})
    tool = tmp_path / "zero_half.py"
    tool.write_text(
        "import sys\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "open(sys.argv[2], 'wb').write(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))\n"
        "print('1 blob, 100 KiB kept')\n"
    )
    pruned = pruned_wheel(wheel, tool, 90, tmp_path / "out")
    with zipfile.ZipFile(pruned) as zf:
        data = zf.read(lib)
        record = zf.read(f"{name}-1.0.dist-info/RECORD").decode()
        assert zf.getinfo(lib).compress_type == zipfile.ZIP_STORED
    assert data == content[:100_000] + bytes(100_000)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert f"{lib},sha256={digest},{len(data)}" in record.splitlines()
    tar = wheelhouse([pruned], tmp_path / "house.tar.xz")
    assert tar.stat().st_size < 130_000  # the random half, the zeros gone
    split(tar, tmp_path / "parts", 64 * 1024)
    assert main(["install", str(tmp_path / "parts"), str(tmp_path / "target")]) == 0
    assert (tmp_path / "target" / lib).read_bytes() == data
    broken = tmp_path / "fails.py"
    broken.write_text("import sys\nsys.exit('no .nv_fatbin section')\n")
    with pytest.raises(PartsError, match="no .nv_fatbin section"):
        pruned_wheel(wheel, broken, 90, tmp_path / "out2")


def test_the_stages_run_on_the_cpu_on_tiny_shapes(carried_parts: Path, tmp_path: Path) -> None:
    """The dry run: torch latency and server (eager; the graph configurations refused in one line on the
    CPU), the carried wheels installed, the onnxruntime-CUDA server not run (why: in the report)."""
    out = tmp_path / "out"
    args = ["stages", "latency-torch", "serve-torch", "install", "serve-ort", "report", "--out", str(out)]
    args += [
        "--work",
        str(tmp_path / "work"),
        "--target",
        str(tmp_path / "target"),
        "--parts",
        str(carried_parts),
    ]
    args += ["--device", "cpu", "--preset", "tiny", "--shapes", "1x16", "--runs", "2", "--warmup", "1"]
    args += ["--clients", "1", "--seconds", "0.5", "--max-batch-size", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_run", *args],
        cwd=REPO,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = sorted(p.name for p in out.iterdir())
    assert {"latency-torch.json", "serve-torch.json", "install.json", "serve-ort.json", "summary.md"} <= set(
        written
    )
    assert len(written) <= 9 and all(p.stat().st_size < 16 << 20 for p in out.iterdir())
    latency = json.loads((out / "latency-torch.json").read_text())["result"]
    paths = {row["path"] for row in latency["rows"]}
    assert {"(a) HF eager", "(c) ours torch eager", "(g) ours fp16 eager"} <= paths
    assert "(g) ours bf16 bucketed, eager replay (CPU dry run)" in paths
    serve = json.loads((out / "serve-torch.json").read_text())["result"]
    assert serve["torch fp32 eager"]["load"][0]["requests"] > 0
    assert "needs torch_device cuda[:N]" in serve["torch fp16 CUDA graphs"]["error"]["tail"][-1]
    assert json.loads((out / "install.json").read_text())["result"]["installed"] == [
        "gpurun_probe-0.1-py3-none-any.whl"
    ]
    summary = (out / "summary.md").read_text()
    assert "## Latency" in summary and "## Server" in summary and "| torch fp32 eager | 1 |" in summary
    assert "| onnx fp32 CUDA provider | - |" in summary and "onnxruntime-gpu" in summary
    assert "- install: exit 0" in summary


def test_the_graphs_tool_without_a_gpu_is_one_line_and_a_bad_shape_is_a_usage_error() -> None:
    """``bench.gpu_graphs`` on this CPU: exit 2 with one line naming the missing CUDA device (no
    traceback); a malformed shape is refused by the parser before torch is asked anything."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the tool measures instead")
    base = [sys.executable, "-m", "bench.gpu_graphs"]
    no_gpu = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert no_gpu.returncode == 2
    assert no_gpu.stderr.strip().splitlines() == [
        f"python -m bench.gpu_graphs: error: needs a CUDA device (torch {torch.__version__} sees none)"
    ]
    bad = subprocess.run(
        [*base, "--shapes", "1x384,8by384"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "a shape is BxT" in bad.stderr and "Traceback" not in bad.stderr
