"""TensorRT runtime side: the GPU stack checks (which part is missing, a driver too old for the CUDA
runtime), imports without torch, TensorRT version matching, the runner's numpy side (dtypes, padding up to
the profile and cutting back) and the torch-free TRTRunner driven through stand-ins for TensorRT and
cuda-bindings. The builder: test_trt_build.py; real engines on an NVIDIA machine are tested there."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest
from paths import REPO
from trt_stand_in import StandInCudart, fake_nvidia_smi, fake_trt_export

from export.onnx.verify import compare
from export.trt import cuda as cuda_runtime
from export.trt import runtime as trt_runtime
from qa_core.runtime import gpu
from qa_core.runtime.gpu_stacks import (
    CUDA13,
    TENSORRT_VERSION,
    TENSORRT_WHEEL,
    tensorrt_release,
    tensorrt_version_problem,
)
from qa_core.runtime.sidecar import Sidecar


# --- the GPU stack checks ------------------------------------------------------------------------------------
def test_stack_check_order(monkeypatch):
    """tensorrt first, then cuda-bindings, then a device (counted by cuda-bindings, else the driver)."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails
    assert gpu.gpu_stack_problem().startswith("TensorRT is not available")
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    monkeypatch.setattr(gpu, "import_cudart", lambda: None)
    assert "cuda-bindings" in gpu.gpu_stack_problem()
    cudart = StandInCudart(devices=0)
    monkeypatch.setattr(gpu, "import_cudart", lambda: cudart)
    assert gpu.gpu_stack_problem().startswith("no CUDA GPU is visible (the CUDA runtime lists none)")
    cudart.devices = 2
    assert gpu.gpu_stack_problem() is None and gpu.cuda_device_count() == 2


def test_a_driver_too_old_for_the_runtime_is_not_reported_as_no_gpu(monkeypatch, tmp_path, stand_in_stack):
    """cudaErrorInsufficientDriver names the installed driver (nvidia-smi, else the kernel module) and the
    CUDA version it supports, the runtime's CUDA version, the driver its stack (the CUDA 12 one here)
    needs, and which extra the driver runs, if any."""
    from server.backends import BackendUnavailable, preflight
    from server.settings import ServerSettings

    cudart, _ = stand_in_stack(
        count_error="cudaErrorInsufficientDriver", driver_version=11040, runtime_version=12090
    )
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "bin", "470.82.01")))
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", tmp_path / "absent")
    problem = gpu.cuda_device_problem()
    assert problem == (
        "the installed NVIDIA driver 470.82.01 (supports CUDA up to 11.4) is too old "
        "(cudaErrorInsufficientDriver (35)): the CUDA runtime here is 12.9, and the gpu-cu12 extra "
        f"(onnxruntime-gpu 1.24.4, TensorRT {TENSORRT_VERSION}, CUDA 12) needs a driver that supports "
        "CUDA 12.x (>= 525.60.13 on Linux); upgrade the driver"
    )
    assert gpu.cuda_device_count() == 0 and gpu.gpu_stack_problem().startswith(problem)
    with pytest.raises(BackendUnavailable) as exc:
        preflight(ServerSettings(backend="trt"))
    assert str(exc.value).startswith(f"--backend trt: {problem}")

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi: the kernel module's version
    (tmp_path / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01  Fri Nov  5 21:45:50 UTC 2021\n"
    )
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", tmp_path / "version")
    assert (
        "the installed NVIDIA driver 470.82.01 (supports CUDA up to 11.4) is too old"
        in gpu.cuda_device_problem()
    )
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", tmp_path / "absent")
    assert "the installed NVIDIA driver (supports CUDA up to 11.4) is too old" in gpu.cuda_device_problem()
    cudart.driver_version = 0  # cudaDriverGetVersion's answer without libcuda
    problem = gpu.cuda_device_problem()
    assert problem.startswith("the CUDA runtime finds no NVIDIA driver (cudaErrorInsufficientDriver (35)): ")
    assert "needs a driver that supports CUDA 12.x (>= 525.60.13 on Linux); install one" in problem


def test_a_cuda_12_driver_under_the_cuda_13_stack_is_told_the_extra_it_runs(
    monkeypatch, tmp_path, stand_in_stack
):
    """The CUDA 13 runtime (cuda-bindings 13) on a 550 driver: the fix named is the gpu-cu12 extra."""
    stand_in_stack(count_error="cudaErrorInsufficientDriver", driver_version=12040, runtime_version=13000)
    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "bin", "550.54.15")))
    assert gpu.cuda_device_problem() == (
        "the installed NVIDIA driver 550.54.15 (supports CUDA up to 12.4) is too old "
        "(cudaErrorInsufficientDriver (35)): the CUDA runtime here is 13.0, and the gpu extra "
        f"(onnxruntime-gpu {CUDA13.onnxruntime_gpu}, TensorRT {TENSORRT_VERSION}, CUDA 13) needs a driver "
        "that supports CUDA 13.x (>= 580 on Linux); this driver runs the gpu-cu12 extra (onnxruntime-gpu "
        f"1.24.4, TensorRT {TENSORRT_VERSION}, CUDA 12): pip install '.[gpu-cu12]' instead, or upgrade the driver"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no driver version: its CUDA version decides
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", tmp_path / "absent")
    assert "this driver runs the gpu-cu12 extra" in gpu.cuda_device_problem()


def test_no_device_and_other_runtime_errors_say_which(monkeypatch, stand_in_stack):
    cudart, _ = stand_in_stack(count_error="cudaErrorNoDevice")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    problem = gpu.cuda_device_problem()
    assert problem.startswith("no CUDA GPU is visible (the CUDA runtime reports cudaErrorNoDevice (100)): ")
    assert 'pip install ".[gpu,tensorrt]"' in problem
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu.cuda_device_problem() == (
        "no CUDA GPU is visible (cudaErrorNoDevice (100) with CUDA_VISIBLE_DEVICES=''): list a GPU there, "
        "or unset it"
    )
    monkeypatch.setenv("PATH", "")
    cudart.count_error = "cudaErrorInvalidValue"
    assert gpu.cuda_device_problem() == (
        "the CUDA runtime cannot use a GPU: cudaGetDeviceCount failed with cudaErrorInvalidValue (1): "
        "invalid argument"
    )
    cudart.count_error = None
    assert gpu.cuda_device_problem() is None and gpu.cuda_device_count() == 1


def test_cuda_versions_as_text():
    assert [gpu.cuda_version_text(v) for v in (12020, 12090, 11040, 13000, 0)] == [
        "12.2",
        "12.9",
        "11.4",
        "13.0",
        None,
    ]


def test_device_count_without_a_usable_runtime_asks_the_driver(monkeypatch, tmp_path):
    def broken() -> tuple[int, int]:
        raise RuntimeError("Failed to dlopen libcudart.so.12")

    monkeypatch.setattr(gpu, "import_cudart", lambda: types.SimpleNamespace(cudaGetDeviceCount=broken))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu.cuda_device_count() == 0  # the driver path honours an empty CUDA_VISIBLE_DEVICES
    monkeypatch.setattr(
        gpu, "import_cudart", lambda: types.SimpleNamespace(cudaGetDeviceCount=lambda: (100, 0))
    )
    assert gpu.cuda_device_count() == 0  # cudaErrorNoDevice


def test_no_device_in_a_process_that_hides_them(tmp_path):
    """A real subprocess with CUDA_VISIBLE_DEVICES="" and no nvidia-smi on PATH sees no GPU, whatever this
    machine has (cuda-bindings honours the variable; the driver fallback checks it first)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PATH": str(tmp_path)}
    code = "from qa_core.runtime.gpu import cuda_device_count; print(cuda_device_count())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stderr


def test_the_runtime_and_the_server_backend_import_without_torch():
    """The gpu extra has no torch: the TensorRT runner, the CUDA buffers and the trt backend must not need it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import export.trt.runtime, export.trt.cuda, export.gpu_versions, server.backends.trt, export.triton\n"
        "print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# --- TensorRT versions ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("built", "runtime", "ok"),
    [
        ("10.14.1.48", "10.14.1.48", True),
        ("10.14.1.48", "10.14.1.48.post1", True),  # the wheel's suffix
        ("10.14.1.48", "10.14.1.7", True),  # the build number does not change the plan format
        ("10.14.1.48", "10.14.2.1", False),
        ("10.14.1.48", "10.13.1.48", False),
        ("10.14.1.48", "11.14.1.48", False),
        ("10.9.0", "10.9.0.34", True),
        ("10.14", "10.14.1.48", False),  # not a full release
        ("", "10.14.1.48", False),
    ],
)
def test_tensorrt_version_table(built, runtime, ok):
    problem = tensorrt_version_problem(built, runtime)
    assert (problem is None) == ok, problem
    if problem and tensorrt_release(built):
        assert built in problem and runtime in problem and "python -m export.trt" in problem


def test_the_pins_agree():
    assert TENSORRT_WHEEL.split("==")[1].startswith(TENSORRT_VERSION)
    assert tensorrt_release(TENSORRT_VERSION) == (10, 14, 1)


# --- the runner's numpy side -----------------------------------------------------------------------------
def test_numpy_dtypes_of_tensorrt_types():
    named = {"FLOAT": "float32", "HALF": "float16", "INT32": "int32", "INT64": "int64", "BOOL": "bool"}
    for trt_name, numpy_name in named.items():
        assert trt_runtime.numpy_dtype(types.SimpleNamespace(name=trt_name)).name == numpy_name
    assert trt_runtime.numpy_dtype("DataType.INT8") == np.int8  # str() of a pybind11 enum
    with pytest.raises(RuntimeError, match="unsupported TensorRT I/O tensor type BF16"):
        trt_runtime.numpy_dtype(types.SimpleNamespace(name="BF16"))


def test_pad_and_cut():
    ids = np.arange(6, dtype=np.int64).reshape(2, 3) + 10
    arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    padded = trt_runtime.pad_to(arrays, (3, 5))
    assert padded["input_ids"].shape == (3, 5) and (padded["input_ids"][:2, :3] == ids).all()
    assert (padded["attention_mask"][2:] == 0).all() and (padded["attention_mask"][:, 3:] == 0).all()
    assert (padded["token_type_ids"][:, 3:] == trt_runtime.PAD_VALUES["token_type_ids"]).all()
    assert trt_runtime.pad_to(arrays, (2, 3))["input_ids"] is ids
    assert trt_runtime._cut("start_logits", np.zeros((3, 5)), (2, 3)).shape == (2, 3)
    assert trt_runtime._cut("cls_logits", np.zeros(3), (2, 3)).shape == (2,)
    assert trt_runtime._cut("start_top_index", np.zeros((3, 4)), (2, 3)).shape == (2, 4)
    assert trt_runtime.check_profile(arrays, (4, 64)) == (2, 3)
    with pytest.raises(ValueError, match="outside the engine's profile"):
        trt_runtime.check_profile(arrays, (1, 64))
    with pytest.raises(ValueError, match="share one"):
        trt_runtime.check_profile({**arrays, "token_type_ids": np.zeros((2, 4))}, (4, 64))


@pytest.mark.parametrize("head", ["shallow", "beam"])
def test_padding_up_to_the_profile_minimum_changes_nothing(tmp_path, spm_dir, head):
    """TRTRunner pads batches below the engine's minimum shape; padded rows and tokens must not change the
    real outputs (checked here with onnxruntime, which accepts any shape)."""
    from export.onnx.verify import sample_batches
    from export.trt.runtime import _cut, pad_to
    from harness.tiny_models import tiny_onnx_export
    from qa_core.runtime.sessions import session
    from qa_core.tokenizer import XLNetTokenizer

    out = tiny_onnx_export(tmp_path / "onnx", spm_dir, head, export={"optimize": False, "verify": False})
    side = Sidecar.load(out)
    sess = session(out / "model.onnx", threads=1)
    batch = sample_batches(XLNetTokenizer.from_dir(out), [(2, 40)], seed=4)[0]
    small = dict(zip(side.outputs, sess.run(side.outputs, batch), strict=True))
    padded = pad_to(batch, (4, 64))
    assert padded["input_ids"].shape == (4, 64) and (padded["attention_mask"][2:] == 0).all()
    big = dict(zip(side.outputs, sess.run(side.outputs, padded), strict=True))
    for name in side.outputs:
        np.testing.assert_allclose(_cut(name, big[name], (2, 40)), small[name], atol=1e-5, err_msg=name)


def test_compare_reports_nan_outputs():
    """NaN hides from max() (max(0.0, nan) == 0.0): compare must report it as a problem of its own."""
    names = ["start_logits", "end_logits"]
    ref = [[np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32)]]
    bad = np.zeros((1, 4), np.float32)
    bad[0, 2] = np.nan
    result = compare(names, ref, [[bad, np.zeros((1, 4), np.float32)]], 1e-3, relative=True)
    assert not result.passed and any("start_logits" in p and "non-finite" in p for p in result.problems)
    inf = np.full((1, 4), np.inf, np.float32)
    assert not compare(names, ref, [[np.zeros((1, 4), np.float32), inf]], 1e-3).passed


# --- TRTRunner through stand-ins for TensorRT and cuda-bindings --------------------------------------------------
def test_runner_without_a_gpu_stack_says_what_is_missing(tmp_path):
    problem = gpu.gpu_stack_problem()
    if problem is None:
        pytest.skip("the GPU stack is present")
    with pytest.raises(RuntimeError) as exc:
        trt_runtime.TRTRunner(fake_trt_export(tmp_path / "trt"))
    assert str(exc.value) == problem


def test_runner_refuses_a_plan_of_another_tensorrt_before_deserialising(tmp_path, stand_in_stack):
    cudart, _ = stand_in_stack(version="10.9.0.34")
    with pytest.raises(RuntimeError) as exc:
        trt_runtime.TRTRunner(fake_trt_export(tmp_path / "trt", version="10.14.1.48"))
    message = str(exc.value)
    assert "built with TensorRT 10.14.1.48 but this machine has TensorRT 10.9.0.34" in message
    assert "python -m export.trt" in message and cudart.calls == []  # nothing touched the GPU


def test_runner_runs_pads_cuts_and_reuses_buffers(tmp_path, stand_in_stack):
    cudart, engine = stand_in_stack(version=TENSORRT_VERSION + ".post1")
    runner = trt_runtime.TRTRunner(fake_trt_export(tmp_path / "trt"))
    assert runner.device_name == "Stand-in GPU 0" and (runner.min_shape, runner.max_shape) == (
        (2, 8),
        (4, 64),
    )
    assert runner.io_dtypes() == {
        "input_ids": "int32",
        "attention_mask": "int64",
        "token_type_ids": "int64",
        "start_logits": "float16",
        "end_logits": "float32",
        "cls_logits": "float32",
    }
    rng = np.random.default_rng(0)

    def check(batch: int, seq: int) -> None:
        ids = rng.integers(5, 100, (batch, seq))
        mask, seg = rng.integers(0, 2, (batch, seq)), rng.integers(0, 3, (batch, seq))
        out = runner.run(ids, mask, seg)
        assert list(out) == ["start_logits", "end_logits", "cls_logits"]
        assert out["start_logits"].dtype == np.float32 and out["start_logits"].shape == (batch, seq)
        np.testing.assert_array_equal(out["start_logits"], ids)
        np.testing.assert_array_equal(out["end_logits"], ids * mask + seg)
        np.testing.assert_array_equal(out["cls_logits"], -(ids * mask).sum(axis=1))

    check(1, 5)  # below the profile's 2x8: padded up, then cut back
    assert engine.context.executed[-1] == (2, 8)
    check(4, 64)
    mallocs = cudart.calls.count("cudaMalloc")
    check(3, 20)  # smaller than before: the grown buffers are reused
    assert cudart.calls.count("cudaMalloc") == mallocs and engine.context.executed[-1] == (3, 20)
    assert cudart.calls.count("cudaSetDevice") >= 4  # every call makes the device current in its thread
    with pytest.raises(ValueError, match="outside the engine's profile"):
        runner.run(*(np.ones((5, 8), np.int64) for _ in range(3)))
    runner.close()
    assert cudart.memory == {} and cudart.calls[-1] == "cudaStreamDestroy"
    runner.close()  # idempotent


def test_the_runner_runs_on_the_device_it_is_given(tmp_path, stand_in_stack):
    """Every CUDA call of the runner happens on its device: cudaSetDevice(device) at load, per call, at close."""
    cudart, engine = stand_in_stack(devices=2)
    runner = trt_runtime.TRTRunner(fake_trt_export(tmp_path / "trt"), device=1)
    assert runner.device_name == "Stand-in GPU 1"
    out = runner.run(*(np.ones((2, 8), np.int64) for _ in range(3)))
    assert out["start_logits"].shape == (2, 8) and engine.context.executed == [(2, 8)]
    runner.close()
    assert len(cudart.set_devices) >= 3 and set(cudart.set_devices) == {1}


def test_a_failing_cuda_call_names_itself(tmp_path, stand_in_stack):
    stand_in_stack(fail="cudaMemcpyAsync cudaMemcpyHostToDevice")
    runner = trt_runtime.TRTRunner(fake_trt_export(tmp_path / "trt"))
    with pytest.raises(cuda_runtime.CudaError) as exc:
        runner.run(*(np.ones((2, 8), np.int64) for _ in range(3)))
    assert str(exc.value) == (
        "CUDA cudaMemcpyAsync host->device for input_ids failed: cudaErrorInvalidValue (1): invalid argument"
    )


def test_without_cuda_bindings_the_runner_says_how_to_install_them(monkeypatch):
    monkeypatch.setattr(cuda_runtime, "import_cudart", lambda: None)
    with pytest.raises(
        cuda_runtime.CudaError,
        match=r"cuda-bindings>=13,<14 with the gpu extra, cuda-bindings>=12.8,<13 with the gpu-cu12.*pip install",
    ):
        cuda_runtime.CudaDevice(0)
