"""The GPU smoke script's bookkeeping on a CPU machine: stages whose packages are missing are named, not
failed; a failure propagates to what needs it; the exit code says which happened."""

from __future__ import annotations

import importlib.util

import pytest

from bench.gpu_smoke import SERVERS, TENSORRT, Stages, device, first_provider, missing


def test_missing_packages_are_named_and_inherited() -> None:
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is installed here")
    stages = Stages()
    assert stages.run("torch", ("torch",), lambda: "built") == "built"
    assert stages.run("engine", (TENSORRT,), lambda: pytest.fail("must not run")) is None
    assert stages.run("server", ("fastapi",), lambda: pytest.fail("must not run"), ["engine"]) is None
    assert stages.results["engine"] == {"missing": [TENSORRT]}
    assert stages.results["server"] == {"missing": [TENSORRT]}  # fastapi is here; the engine is not
    assert stages.exit_code() == 3
    table = stages.table()
    assert "NOT RUN" in table and f"missing packages: {TENSORRT}" in table


def test_a_failure_fails_the_run_and_what_depends_on_it() -> None:
    stages = Stages()

    def broken() -> None:
        raise RuntimeError("asked for CUDAExecutionProvider but the server runs on CPUExecutionProvider")

    stages.run("export", ("torch",), broken)
    stages.run("serve", ("torch",), lambda: pytest.fail("must not run"), ["export"])
    assert stages.results["serve"] == {"error": "needs export, which failed"}
    assert stages.exit_code() == 1 and "FAILED" in stages.table()


def test_onnxruntime_gpu_counts_as_missing_with_the_cpu_wheel() -> None:
    import onnxruntime

    has_cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert missing(["onnxruntime-gpu"]) == ([] if has_cuda else ["onnxruntime-gpu"])
    assert missing(["torch", "fastapi"]) == []


def test_each_server_is_checked_where_it_ran() -> None:
    assert (
        first_provider({"providers": ["CPUExecutionProvider", "CUDAExecutionProvider"]})
        == "CPUExecutionProvider"
    )
    assert device({"device": "cpu"}) == "cpu"
    expected = {name: run.expected for name, run in SERVERS.items()}
    assert expected == {
        "trt backend": "cuda",
        "onnx + CUDA provider": "CUDAExecutionProvider",
        "onnx + TensorRT provider": "TensorrtExecutionProvider",
        "torch on CUDA": "cuda",
    }
