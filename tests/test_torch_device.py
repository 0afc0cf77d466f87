"""The torch backend's device: ``--torch-device cuda[:N]`` runs on a GPU or refuses to start (never a
silent CPU); on an NVIDIA machine (``-m gpu``) it serves over HTTP with the CPU's answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from gpu_mode import SERVING_PACKAGES, require_package, require_torch_cuda
from paths import REPO
from server_helpers import ServerProcess, dev_questions, server_env

from server.answering.model_spec import resolve_spec
from server.backends.base import dummy_batch
from server.backends.torch import TorchBackend, torch_device_problem


def _server(model: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "server", "--model", str(model), "--backend", "torch", *flags]
    return subprocess.run(cmd, cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=120)


def test_a_device_this_torch_cannot_use_is_one_line_before_listening(onnx_export: Path) -> None:
    bad = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    proc = _server(onnx_export, "--torch-device", bad, "--port", "1")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0] == f"error: {torch_device_problem(bad)}"
    assert f"torch {torch.__version__}" in lines[0]


def test_a_device_that_is_not_one_is_refused_by_the_settings(onnx_export: Path) -> None:
    proc = _server(onnx_export, "--torch-device", "gpu0", "--port", "1")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "torch_device" in lines[0], proc.stderr


def test_the_cpu_device_is_reported() -> None:
    assert torch_device_problem("cpu") is None


def test_a_benchmark_names_its_own_flag_for_a_device_it_cannot_use() -> None:
    """bench.latency --device takes the server's check, worded with the flag the user typed."""
    assert (
        torch_device_problem("gpu0", flag="--device")
        == "--device 'gpu0': not a torch device (cpu, cuda or cuda:N)"
    )
    bad = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.latency", "--device", bad],
        cwd=REPO,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1].endswith(f"error: {torch_device_problem(bad, flag='--device')}")
    )


@pytest.mark.gpu
def test_torch_backend_on_cuda_matches_the_cpu(onnx_export: Path) -> None:
    require_torch_cuda()
    spec = resolve_spec(onnx_export, "torch")
    cpu, gpu = TorchBackend(spec), TorchBackend(spec, device="cuda")
    assert gpu.describe()["device"] == "cuda" and gpu.describe()["gpu"]
    for batch, seq in ((1, 16), (3, 100)):
        feeds = dummy_batch(batch, seq)
        want, got = cpu.run(feeds), gpu.run(feeds)
        for name in want:
            scale = max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(got[name], want[name], atol=1e-3 * scale, rtol=0)  # TF32 matmuls


@pytest.mark.gpu
def test_torch_backend_on_cuda_serves(onnx_export: Path, tmp_path: Path) -> None:
    require_torch_cuda()
    for module, package in SERVING_PACKAGES.items():
        require_package(module, package)  # a GPU machine's own Python may lack the server's packages
    question, context = dev_questions()[0]
    with ServerProcess(onnx_export, tmp_path, "--torch-device", "cuda", backend="torch") as server:
        ready = httpx.get(server.url + "/readyz").json()
        assert ready == {"status": "ready", "device": "cuda"}
        r = httpx.post(server.url + "/answer", json={"question": question, "context": context}, timeout=60)
        assert r.status_code == 200, r.text


def test_a_tensorrt_provider_start_gets_an_engine_build_deadline(tmp_path: Path) -> None:
    """A first start with the TensorRT provider builds engines for minutes: a longer default deadline,
    and the progress lines say why it takes long and whether the next start will be quicker."""
    from server.settings import ENGINE_BUILD_TIMEOUT_S, LOAD_TIMEOUT_S, ServerSettings

    assert ServerSettings().load_deadline_s == LOAD_TIMEOUT_S and ServerSettings().engine_build_note == ""
    trt = ServerSettings(providers="tensorrt", trt_cache_dir=tmp_path)
    assert trt.load_deadline_s == ENGINE_BUILD_TIMEOUT_S > LOAD_TIMEOUT_S
    assert f"the next start reuses {tmp_path}" in trt.engine_build_note
    assert "every start builds them" in ServerSettings(providers="trt").engine_build_note
    assert ServerSettings(providers="tensorrt", load_timeout_s=5).load_deadline_s == 5
