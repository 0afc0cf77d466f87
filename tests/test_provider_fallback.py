"""Never silently on the CPU: a first provider that onnxruntime does not activate stops the server (one
line naming the cause) unless ``--allow-cpu-fallback``; short provider names; ``export.onnx
--verify-provider``. The CPU wheel here, and the real onnxruntime-gpu wheel without NVIDIA's libraries
(``make ort-gpu-venv``, which ``make test`` builds): the day-one failure of a GPU install, testable
without a GPU."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import REPO
from server_helpers import ServerProcess, server_env

from qa_core.runtime.providers import CPU, CUDA, TENSORRT, canonical_provider, parse_providers

ORT_GPU_ENV = "XLNETQA_ORT_GPU_PYTHON"  # set by `make test` to the venv `make ort-gpu-venv` builds


@pytest.mark.parametrize("name", ["cuda", "CUDAExecutionProvider", "tensorrt", "TRT"])
def test_server_refuses_missing_providers_before_listening(onnx_export: Path, name: str) -> None:
    """`--providers cuda` (short or full name) with the CPU wheel: exit 2 and one line with the fix."""
    import onnxruntime

    if CUDA in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: nothing is missing")
    cmd = [sys.executable, "-m", "server", "--model", str(onnx_export), "--providers", name, "--port", "1"]
    proc = subprocess.run(cmd, cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "need the onnxruntime-gpu wheel" in lines[0] and "make gpu-venv" in lines[0]
    assert canonical_provider(name) in lines[0] and "--allow-cpu-fallback" in lines[0]


def test_an_unknown_provider_name_is_refused_with_the_spellings(onnx_export: Path) -> None:
    cmd = [sys.executable, "-m", "server", "--model", str(onnx_export), "--providers", "cuda,cdua"]
    proc = subprocess.run(cmd, cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "unknown onnxruntime provider 'cdua'" in lines[0] and "tensorrt" in lines[0]


def test_provider_names_short_and_full() -> None:
    assert parse_providers("auto") is None and parse_providers(" AUTO ") is None
    assert parse_providers("cuda") == [CUDA]
    assert parse_providers("trt, cuda ,cpu") == [TENSORRT, CUDA, CPU]
    for never_used in ("cpu,cuda", "cuda,tensorrt", "cuda,cpu,trt"):
        with pytest.raises(ValueError, match="list them fastest first: "):
            parse_providers(never_used)
    assert parse_providers("TensorrtExecutionProvider,tensorrt") == [TENSORRT]  # one entry per provider
    assert parse_providers("cudaexecutionprovider") == [CUDA]
    for bad in ("", " , ", "gpu", "CUDAProvider"):
        with pytest.raises(ValueError):
            parse_providers(bad)


def test_a_session_that_falls_back_is_caught_by_reading_its_providers() -> None:
    """onnxruntime's real session, asked for a list whose first provider is not active here: the check
    reads get_providers() back and names the cause; a session on what was asked passes."""
    import onnxruntime

    from qa_core.runtime.probe import Probe, fallback_problem, probe

    if CUDA in onnxruntime.get_available_providers():
        pytest.skip("this wheel compiles CUDA in: see the onnxruntime-gpu venv test")
    result = probe([(CUDA, {"device_id": "0"}), CPU])
    assert result.active == [CPU] and result.requested == [CUDA, CPU] and not result.ok
    line = fallback_problem(result, "advice")
    assert line is not None and "\n" not in line
    assert line.startswith(f"onnxruntime was asked for {CUDA} but the session runs on {CPU}: ")
    assert "onnxruntime-gpu" in line and line.endswith("; advice")
    assert fallback_problem(probe([CPU])) is None
    assert fallback_problem(Probe([CPU], error="RuntimeError: boom")) is not None


def test_the_backend_refuses_a_fallback_unless_allowed(onnx_export: Path) -> None:
    """In-process: the model's own session is checked too, not only the probe before listening."""
    import onnxruntime

    from server.answering.model_spec import resolve_spec
    from server.backends import BackendUnavailable
    from server.backends.onnx import OnnxBackend

    if CUDA in onnxruntime.get_available_providers():
        pytest.skip("this wheel compiles CUDA in: see the onnxruntime-gpu venv test")
    spec = resolve_spec(onnx_export, "onnx")
    with pytest.raises(BackendUnavailable, match="--allow-cpu-fallback"):
        OnnxBackend(spec, providers=[CUDA])
    served = OnnxBackend(spec, providers=[CUDA], allow_cpu_fallback=True)
    facts = served.describe()
    assert facts["providers"] == [CPU] and facts["requested_providers"] == [CUDA]
    assert facts["model_file"] == spec.model_file  # the CPU-optimised graph, not the GPU one


def _serve_and_read(python: str, model: Path, tmp_path: Path, *flags: str) -> tuple[dict, dict, str, str]:
    """Start ``python -m server`` with ``flags``; /readyz, /v1/model's runtime, /metrics and the log."""
    import httpx

    with ServerProcess(model, tmp_path, *flags, python=python, log_level="info") as server:
        ready = httpx.get(server.url + "/readyz").json()
        runtime = httpx.get(server.url + "/v1/model").json()["runtime"]
        metrics = httpx.get(server.url + "/metrics").text
        answer = httpx.post(server.url + "/answer", json={"question": "Who?", "context": "Ada wrote it."})
        assert answer.status_code == 200, answer.text
    return ready, runtime, metrics, server.log()


def test_cpu_fallback_serves_only_when_allowed_and_says_so(onnx_export: Path, tmp_path: Path) -> None:
    import onnxruntime

    if CUDA in onnxruntime.get_available_providers():
        pytest.skip("this wheel compiles CUDA in: see the onnxruntime-gpu venv test")
    ready, runtime, metrics, log = _serve_and_read(
        sys.executable, onnx_export, tmp_path, "--providers", "cuda", "--allow-cpu-fallback"
    )
    assert ready == {"status": "ready", "providers": [CPU]}
    assert runtime["providers"] == [CPU] and runtime["requested_providers"] == [CUDA]
    assert f'providers="{CPU}"' in metrics and "xlnetqa_runtime_info{" in metrics
    assert (
        "--allow-cpu-fallback: skipping CUDAExecutionProvider: onnxruntime was asked for CUDAExecutionProvider"
        in log
    )


# ---- onnxruntime-gpu without the NVIDIA libraries (make ort-gpu-venv): the silent-fallback case -----


@functools.cache
def ort_gpu_python() -> str:
    """The onnxruntime-gpu venv's Python; `make test` builds it and names it, so there it must exist."""
    named = os.environ.get(ORT_GPU_ENV)
    python = Path(named) if named else REPO / ".venv-ortgpu" / "bin" / "python"
    if not python.is_file():
        if named:
            pytest.fail(f"{ORT_GPU_ENV}={named} does not exist (make ort-gpu-venv)", pytrace=False)
        pytest.skip("no onnxruntime-gpu venv (make ort-gpu-venv)")
    code = (
        "from qa_core.runtime.probe import provider_library_problem as p; print(p('CUDAExecutionProvider'))"
    )
    check = _run_in(str(python), "-c", code)
    if check.returncode != 0 or check.stdout.strip() == "None":
        pytest.skip(
            "CUDA's libraries load here (a system-wide CUDA): the missing-library case cannot be made"
        )
    return str(python)


def _run_in(python: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, *args], cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=timeout
    )


@functools.cache
def ort_gpu_cuda_major() -> int:
    """The CUDA major version the venv's onnxruntime-gpu is built for (12 or 13: the stack it pins)."""
    code = "from onnxruntime.capi.build_and_package_info import cuda_version; print(cuda_version)"
    return int(_run_in(ort_gpu_python(), "-c", code).stdout.strip().split(".")[0])


@pytest.mark.parametrize(
    ("name", "missing"),
    [("cuda", "libcublasLt.so.{}"), (CUDA, "libcublasLt.so.{}"), ("tensorrt", "libcublas.so.{}")],
)
def test_gpu_wheel_without_its_libraries_refuses_to_start(onnx_export: Path, name: str, missing: str) -> None:
    """The day-one failure: onnxruntime-gpu installed, CUDA libraries (or GPU) missing. onnxruntime would
    run the model on the CPU and the server say ready; instead: exit 2 within seconds, one line naming
    the first library of its CUDA version that is missing."""
    python = ort_gpu_python()
    missing = missing.format(ort_gpu_cuda_major())
    started = time.monotonic()
    proc = _run_in(python, "-m", "server", "--model", str(onnx_export), "--providers", name, "--port", "1")
    elapsed = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert elapsed < 30, elapsed
    line = lines[0]
    assert f"onnxruntime was asked for {canonical_provider(name)} but the session" in line
    assert f"{missing}: cannot open shared object file" in line and "make gpu-venv" in line
    assert "--allow-cpu-fallback" in line and proc.stdout == ""


def test_gpu_wheel_without_its_libraries_serves_from_the_cpu_when_allowed(
    onnx_export: Path, tmp_path: Path
) -> None:
    python = ort_gpu_python()
    ready, runtime, metrics, _ = _serve_and_read(
        python, onnx_export, tmp_path, "--providers", "CUDAExecutionProvider", "--allow-cpu-fallback"
    )
    assert ready == {"status": "ready", "providers": [CPU]}
    assert runtime["requested_providers"] == [CUDA] and runtime["model_file"] == "model.onnx"
    assert f'providers="{CPU}"' in metrics
    auto_ready, auto_runtime, _, log = _serve_and_read(python, onnx_export, tmp_path)  # auto: the CPU
    assert auto_ready["providers"] == [CPU] and auto_runtime["requested_providers"] == "auto"
    assert "providers auto: CUDA is compiled in but does not run here" in log


def test_stack_report_in_the_gpu_wheel_venv_says_no_provider_runs_on_a_gpu() -> None:
    python = ort_gpu_python()
    plain = _run_in(python, "-m", "export.stack_report")
    assert plain.returncode == 0, plain.stderr
    assert "no onnxruntime provider runs on a GPU here: sessions get the CPU" in plain.stdout
    assert f"{CUDA}: compiled in, does not run: libonnxruntime_providers_cuda.so cannot load" in plain.stdout
    report = json.loads(_run_in(python, "-m", "export.stack_report", "--json").stdout)
    assert report["onnxruntime_wheels"] == {"onnxruntime-gpu": report["onnxruntime"]}
    assert {CUDA, TENSORRT} <= set(report["providers"]) and set(report["gpu_providers_not_running"]) == {
        CUDA,
        TENSORRT,
    }
    strict = _run_in(python, "-m", "export.stack_report", "--require-gpu")
    assert strict.returncode == 1 and f"PROBLEM: {CUDA} is compiled in but does not run here" in strict.stderr


# ---- export.onnx --verify-provider -------------------------------------------------------------------


def test_export_verifies_on_the_providers_named(qa_checkpoint: Path, tmp_path: Path) -> None:
    from export.onnx.cli import main

    out = tmp_path / "export"
    assert main(["--checkpoint", str(qa_checkpoint), "--out", str(out), "--verify-provider", "cpu"]) == 0
    record = json.loads((out / "export.json").read_text())["verification"]["providers"]
    assert list(record) == [CPU] and record[CPU]["passed"] and record[CPU]["graph"] == "model.onnx"


def test_export_fails_when_a_named_provider_falls_back(qa_checkpoint: Path, tmp_path: Path) -> None:
    import onnxruntime

    if CUDA in onnxruntime.get_available_providers():
        pytest.skip("this wheel compiles CUDA in")
    out = tmp_path / "export"
    cmd = [sys.executable, "-m", "export.onnx", "--checkpoint", str(qa_checkpoint), "--out", str(out)]
    proc = subprocess.run(
        [*cmd, "--verify-provider", "cuda"], cwd=REPO, env=server_env(), capture_output=True, text=True
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and not out.exists() and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "verification failed, nothing written: --verify-provider CUDAExecutionProvider: onnxruntime was"
        in last
    )
    assert "need the onnxruntime-gpu wheel" in last
    bad = subprocess.run(
        [*cmd, "--verify-provider", "gpu"], cwd=REPO, env=server_env(), capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown onnxruntime provider 'gpu'" in bad.stderr


def test_fallback_walks_down_the_list_and_int8_is_refused_before_listening(onnx_export: Path) -> None:
    """With --allow-cpu-fallback each provider that does not run is skipped in turn (TensorRT, then CUDA,
    then the CPU), each with its cause; an int8 export is refused for GPU providers before listening."""
    import dataclasses

    from server.answering.model_spec import resolve_spec
    from server.backends import BackendUnavailable, check_spec
    from server.settings import ServerSettings

    python = ort_gpu_python()
    proc = _run_in(
        python,
        "-c",
        "import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.WARNING);"
        "from server.backends.onnx import first_that_runs;"
        "print(first_that_runs(['TensorrtExecutionProvider', 'CUDAExecutionProvider', 'CPUExecutionProvider'], 0))",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "['CPUExecutionProvider']"
    assert (
        "skipping TensorrtExecutionProvider" in proc.stdout
        and "skipping CUDAExecutionProvider" in proc.stdout
    )
    spec = dataclasses.replace(resolve_spec(onnx_export, "onnx"), precision="int8")
    with pytest.raises(BackendUnavailable, match="int8 export runs on the CPU provider only"):
        check_spec(spec, ServerSettings(providers="cuda"))
    check_spec(spec, ServerSettings(providers="cpu"))  # the CPU is what int8 runs on
