"""onnxruntime providers: install-path checks, provider choice and options, the graph each provider loads,
the GPU test mode; and, on an NVIDIA machine (`-m gpu`), every node on the GPU with CPU-equal outputs."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
from gpu_mode import REQUIRE_ENV, gpu_required, require_provider
from paths import REPO
from server_helpers import ServerProcess, server_env

from qa_core.runtime.providers import (
    CPU,
    CUDA,
    TENSORRT,
    ProfileShapes,
    choose_providers,
    graph_for,
    install_problem,
    installed_onnxruntime_wheels,
    provider_names,
    tensorrt_options,
)

PROFILE = ProfileShapes(max_batch=8, max_seq_len=384)
# ops that carry the model's arithmetic: on a GPU provider none may run on the CPU
COMPUTE_OPS = {
    "MatMul",
    "Gemm",
    "Softmax",
    "Erf",
    "Tanh",
    "Relu",
    "LayerNormalization",
    "ReduceMean",
    "Pow",
    "Sqrt",
}


def fake_site(tmp_path: Path, wheels: dict[str, str]) -> Path:
    """A site-packages directory holding only the given wheels' metadata, as pip lays it out."""
    site = tmp_path / "site"
    for name, version in wheels.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


# ---- the install path -----------------------------------------------------------------------------


def test_both_wheels_installed_is_named_with_the_fix(tmp_path: Path) -> None:
    site = fake_site(tmp_path, {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.24.4", "numpy": "2.0.0"})
    wheels = installed_onnxruntime_wheels(importlib.metadata.distributions(path=[str(site)]))
    assert wheels == {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.24.4"}
    line = install_problem([CUDA], [CPU], wheels)
    assert line is not None and "both onnxruntime 1.31.1, onnxruntime-gpu 1.24.4" in line
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu" in line
    only_cpu = install_problem([TENSORRT], [CPU], {"onnxruntime": "1.31.1"})
    assert only_cpu is not None and "need the onnxruntime-gpu wheel" in only_cpu
    gpu_wheel_no_driver = install_problem([CUDA], [CPU], {"onnxruntime-gpu": "1.24.4"})
    assert gpu_wheel_no_driver is not None and "NVIDIA driver" in gpu_wheel_no_driver
    assert install_problem([CPU], [CPU], wheels) is None


def test_this_environment_has_one_onnxruntime_wheel() -> None:
    """What `make venv` installs: the CPU wheel alone (a second one would make providers a coin toss)."""
    assert list(installed_onnxruntime_wheels()) == ["onnxruntime"]


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _resolve(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """Requirement names an extra installs, following `xlnet-qa[...]` self-references."""
    names: set[str] = set()
    for req in extras[extra]:
        if req.startswith("xlnet-qa["):
            for inner in req[len("xlnet-qa[") : -1].split(","):
                names |= _resolve(inner.strip(), extras)
        else:
            names.add(req.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip())
    return names


def test_no_extra_installs_both_onnxruntime_wheels_and_gpu_pins_agree() -> None:
    from qa_core.runtime.gpu_stacks import CUDA12, CUDA13, STACKS, TENSORRT_VERSION

    extras = _extras()
    for extra in extras:
        names = _resolve(extra, extras)
        assert not {"onnxruntime", "onnxruntime-gpu"} <= names, extra
    assert {s.cuda_major: s.extra for s in STACKS} == {13: "gpu", 12: "gpu-cu12"}
    for stack in STACKS:
        gpu = _resolve(stack.extra, extras)
        # the onnxruntime-gpu part installs from PyPI alone; TensorRT (NVIDIA's index) is its own extra
        assert {"onnxruntime-gpu", "cuda-bindings"} <= gpu and not {"torch", stack.tensorrt_package} & gpu
        assert _resolve(stack.tensorrt_extra, extras) == {stack.tensorrt_package}
        assert stack.onnxruntime_gpu_wheel in extras[stack.extra]  # one home: qa_core/runtime/gpu_stacks.py
        assert stack.cuda_bindings in extras[stack.extra]
        assert extras[stack.tensorrt_extra] == [stack.tensorrt_wheel]
        assert stack.tensorrt_wheel_version.startswith(TENSORRT_VERSION)  # one engine format for both
    assert CUDA13.onnxruntime_gpu.startswith("1.31.") and CUDA12.onnxruntime_gpu == "1.24.4"
    assert "onnxruntime-gpu" in _resolve("gpu-dev", extras) and "pytest" in _resolve("gpu-dev", extras)


@pytest.mark.parametrize(
    ("driver", "extra"),
    [
        ("595.45.04", "gpu"),
        ("580.65.06", "gpu"),
        ("580", "gpu"),
        ("575.57.08", "gpu-cu12"),
        ("535.104.05", "gpu-cu12"),
        ("525.60.13", "gpu-cu12"),
        ("525.60.11", None),
        ("470.82.01", None),
    ],
)
def test_a_driver_version_names_the_extra_it_runs(driver: str, extra: str | None) -> None:
    """Driver -> the newest CUDA major it runs -> the extra; one line from the command, exit 1 for none."""
    from qa_core.runtime.gpu_stacks import stack_for_driver

    stack = stack_for_driver(driver)
    assert (stack.extra if stack else None) == extra
    proc = subprocess.run(
        [sys.executable, "-m", "export.gpu_versions", "--driver", driver],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and proc.stderr == "" and lines[0].startswith(f"NVIDIA driver {driver} ")
    if extra is None:
        assert proc.returncode == 1 and "upgrade the driver" in lines[0] and ">= 525.60.13" in lines[0]
    else:
        assert proc.returncode == 0 and f"pip install '.[{extra}]'" in lines[0]
    if extra == "gpu-cu12":
        assert "the gpu extra, CUDA 13, needs a driver that supports CUDA 13.x (>= 580 on Linux)" in lines[0]


def test_the_driver_question_without_a_driver_or_with_nonsense_is_one_line() -> None:
    from qa_core.runtime.gpu import nvidia_driver_version

    if nvidia_driver_version() is not None:
        pytest.skip("this machine has an NVIDIA driver")
    cmd = [sys.executable, "-m", "export.gpu_versions", "--driver"]
    none = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert none.returncode == 1 and none.stderr.startswith("error: no NVIDIA driver here")
    bad = subprocess.run([*cmd, "latest"], cwd=REPO, capture_output=True, text=True)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: --driver 'latest': not a driver version like 580.65.06"
    )
    extra = subprocess.run(
        [sys.executable, "-m", "export.gpu_versions", "--print", "extra"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert extra.stdout.strip() == "gpu"  # no driver here: the default stack


def test_gpu_wheels_name_the_pythons_and_platforms_they_exist_for() -> None:
    """pip only says "no matching distribution"; `make gpu-venv` asks this first."""
    from qa_core.runtime.gpu_stacks import CUDA12, python_problem

    assert python_problem((3, 12), "Linux", "x86_64", tensorrt=True) is None
    assert python_problem((3, 14), "Linux", "x86_64") is None  # onnxruntime-gpu alone
    too_new = python_problem((3, 14), "Linux", "x86_64", tensorrt=True)
    assert too_new is not None and "CPython 3.11-3.13" in too_new and "tensorrt-cu13 3.8-3.13" in too_new
    too_new_12 = python_problem((3, 14), "Linux", "x86_64", tensorrt=True, stack=CUDA12)
    assert too_new_12 is not None and "tensorrt-cu12 3.8-3.13" in too_new_12
    too_old = python_problem((3, 10), "Linux", "x86_64")
    assert too_old is not None and "Python 3.10" in too_old and "make gpu-venv PYTHON=python3.12" in too_old
    arm = python_problem((3, 12), "Linux", "aarch64")
    assert arm is not None and "only for Linux x86_64 and Windows AMD64" in arm
    for extra in ("gpu", "gpu-cu12"):
        proc = subprocess.run(
            [sys.executable, "-m", "export.gpu_versions", "--print", "onnxruntime-gpu", "--extra", extra],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert (
            proc.returncode == 0 and f"onnxruntime-gpu[cuda,cudnn]=={proc.stdout.strip()}" in _extras()[extra]
        )


def test_an_unreachable_tensorrt_index_is_one_line(tmp_path: Path) -> None:
    """The TensorRT stubs download from NVIDIA's index: without it, one line saying so (no pip traceback)."""
    import socket

    with socket.socket() as closed:  # a port nothing listens on: refused at once, as a blocked proxy would
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/simple/"
    cmd = [sys.executable, "-m", "export.gpu_versions", "--tensorrt", "--index", url]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 1 and "Python" in proc.stderr and "pinned GPU wheels" in proc.stderr:
        pytest.skip(f"this Python has no TensorRT wheels: {lines[0]}")
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "stubs that download the real wheels from NVIDIA's index" in lines[0] and url in lines[0]


def test_stack_report_runs_and_fails_when_a_gpu_is_required() -> None:
    cmd = [sys.executable, "-m", "export.stack_report"]
    plain = subprocess.run([*cmd, "--json"], cwd=REPO, env=server_env(), capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr
    report = json.loads(plain.stdout)
    assert (
        report["onnxruntime_wheels"] == {"onnxruntime": report["onnxruntime"]} and CPU in report["providers"]
    )
    strict = subprocess.run(
        [*cmd, "--require-gpu"], cwd=REPO, env=server_env(), capture_output=True, text=True
    )
    assert "Traceback" not in strict.stderr
    if report["cuda_devices"] == 0:
        assert strict.returncode == 1
        assert "PROBLEM: no CUDA GPU is visible" in strict.stderr
        assert (
            "need the onnxruntime-gpu wheel" in strict.stderr
            and "TensorRT is not importable" in strict.stderr
        )
    else:  # a GPU machine: the strict report passes exactly when it finds nothing wrong
        listed = [line for line in strict.stderr.splitlines() if line.startswith("PROBLEM: ")]
        assert (strict.returncode == 0) == (not listed), strict.stderr
        if gpu_required():  # `make gpu-test` in the complete GPU venv: nothing may be wrong
            assert strict.returncode == 0, strict.stderr


def test_stack_report_names_a_wheel_clash_once() -> None:
    from export.stack_report import pinned, problems

    report = {
        "onnxruntime_wheels": {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.24.4"},
        "providers": [CPU],
        "cuda_devices": 1,
        "tensorrt": "10.14.1.48",
        "pinned": pinned(),
    }
    for require_gpu in (False, True):
        found = problems(report, require_gpu)
        assert len(found) == 1 and "both onnxruntime 1.31.1, onnxruntime-gpu 1.24.4" in found[0], found
    clean = {
        **report,
        "onnxruntime_wheels": {"onnxruntime-gpu": "1.24.4"},
        "providers": [TENSORRT, CUDA, CPU],
    }
    assert problems(clean, require_gpu=True) == []
    unpinned = problems({**clean, "onnxruntime_wheels": {"onnxruntime-gpu": "1.30.0"}}, require_gpu=True)
    assert unpinned == ["onnxruntime-gpu 1.30.0 is not a pinned version: 1.31.1 (gpu), 1.24.4 (gpu-cu12)"]


def test_stack_report_names_a_driver_too_old_for_the_onnxruntime_gpu_build() -> None:
    """The CUDA 13 wheel on a 550 driver: one problem naming the extra that driver runs, GPU required
    or not; the same wheel on a 580 driver, or the CUDA 12 wheel on the 550 one, is fine."""
    from export.stack_report import pinned, problems

    report = {
        "onnxruntime_wheels": {"onnxruntime-gpu": "1.31.1"},
        "onnxruntime_cuda": "13.0",
        "driver": "550.54.15",
        "providers": [TENSORRT, CUDA, CPU],
        "cuda_devices": 1,
        "tensorrt": "10.14.1.48",
        "pinned": pinned(),
    }
    for require_gpu in (False, True):
        (line,) = problems(report, require_gpu)
        assert line.startswith("onnxruntime-gpu 1.31.1 is built for CUDA 13.0, but NVIDIA driver 550.54.15 ")
        assert "pip install '.[gpu-cu12]'" in line
    assert problems({**report, "driver": "580.95.05"}, require_gpu=True) == []
    cuda12 = {**report, "onnxruntime_wheels": {"onnxruntime-gpu": "1.24.4"}, "onnxruntime_cuda": "12.8"}
    assert problems(cuda12, require_gpu=True) == []


# ---- provider choice, options and graph -----------------------------------------------------------


def test_auto_is_cuda_when_there_and_never_tensorrt_unasked() -> None:
    gpu = [TENSORRT, CUDA, CPU]
    assert choose_providers(gpu, None, profile=PROFILE) == [(CUDA, {"device_id": "0"}), CPU]
    assert choose_providers([CPU], None, profile=PROFILE) == [CPU]
    assert choose_providers(gpu, None, profile=PROFILE, precision="int8") == [CPU]
    with pytest.raises(ValueError, match="int8 export runs on the CPU provider only"):
        choose_providers(gpu, [CUDA], profile=PROFILE, precision="int8")
    with pytest.raises(ValueError, match="need the onnxruntime-gpu wheel"):
        choose_providers([CPU], [TENSORRT], profile=PROFILE, wheels={"onnxruntime": "1.31.1"})


def test_tensorrt_provider_gets_caches_a_profile_and_fallbacks(tmp_path: Path) -> None:
    profile = ProfileShapes(max_batch=8, max_seq_len=384, opt_batch=4)
    entries = choose_providers(
        [TENSORRT, CUDA, CPU], [TENSORRT], profile=profile, trt_cache_dir=tmp_path, trt_fp16=True, device_id=1
    )
    assert provider_names(entries) == [TENSORRT, CUDA, CPU]  # nodes TensorRT does not take still run
    name, options = entries[0]
    assert name == TENSORRT and options["device_id"] == "1" and options["trt_fp16_enable"] == "True"
    assert options["trt_profile_min_shapes"] == "input_ids:1x1,attention_mask:1x1,token_type_ids:1x1"
    assert options["trt_profile_opt_shapes"] == "input_ids:4x384,attention_mask:4x384,token_type_ids:4x384"
    assert options["trt_profile_max_shapes"] == "input_ids:8x384,attention_mask:8x384,token_type_ids:8x384"
    assert options["trt_engine_cache_enable"] == options["trt_timing_cache_enable"] == "True"
    assert options["trt_engine_cache_path"] == options["trt_timing_cache_path"] == str(tmp_path.resolve())
    no_cache = choose_providers([TENSORRT, CPU], [TENSORRT], profile=profile)[0][1]
    assert "trt_engine_cache_enable" not in no_cache and no_cache["trt_fp16_enable"] == "False"
    beam = tensorrt_options(ProfileShapes(max_batch=2, max_seq_len=64, min_seq_len=5), None, False)
    assert beam["trt_profile_min_shapes"] == "input_ids:1x5,attention_mask:1x5,token_type_ids:1x5"
    bad_profiles = (
        dict(max_batch=0, max_seq_len=8),
        dict(max_batch=2, max_seq_len=8, opt_batch=3),
        dict(max_batch=2, max_seq_len=8, min_seq_len=9),
    )
    for bad in bad_profiles:
        with pytest.raises(ValueError, match="profile"):
            ProfileShapes(**bad)


def test_gpu_providers_load_the_portable_graph(onnx_export: Path) -> None:
    side = json.loads((onnx_export / "export.json").read_text())
    model, portable = side["model_file"], side["portable_model_file"]
    assert portable and portable != model  # the fp32 export ships both graphs
    assert graph_for([(CUDA, {}), CPU], model, portable) == portable
    assert graph_for([(TENSORRT, {}), (CUDA, {}), CPU], model, portable) == portable
    assert graph_for([CPU], model, portable) == model
    assert graph_for([(CUDA, {})], "model.onnx", None) == "model.onnx"  # fp16/int8: one graph
    with pytest.raises(ValueError, match="int8 export runs on the CPU provider only"):
        graph_for([(CUDA, {})], "model.onnx", None, "int8")
    assert graph_for([CPU], "model.onnx", None, "int8") == "model.onnx"
    import onnx

    ops = {(n.domain or "ai.onnx") for n in onnx.load(str(onnx_export / portable)).graph.node}
    assert ops == {"ai.onnx"}, ops  # standard ops only: nothing for a GPU provider to hand back to the CPU


def test_a_cache_dir_that_cannot_be_made_is_one_line(onnx_export: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cmd = [sys.executable, "-m", "server", "--model", str(onnx_export), "--trt-cache-dir", str(blocker / "c")]
    cmd += ["--providers", TENSORRT]  # the directory only matters to the TensorRT provider
    proc = subprocess.run(
        [*cmd, "--port", "0"],
        cwd=REPO,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: --trt-cache-dir {blocker / 'c'}: ")


# ---- the GPU test mode ----------------------------------------------------------------------------


def test_gpu_mode_fails_instead_of_skipping_when_required(tmp_path: Path) -> None:
    """`XLNETQA_REQUIRE_GPU=1 pytest -m gpu`: a missing provider is a failure, not a skip."""
    if CUDA in __import__("onnxruntime").get_available_providers():
        pytest.skip("the CUDA provider is here: the required mode would pass")
    test = f"{Path(__file__).name}::test_gpu_provider_runs_every_node_on_the_gpu_and_matches_the_cpu"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", test]
    run = lambda env: subprocess.run(  # noqa: E731
        cmd, cwd=REPO / "tests", env=server_env(env), capture_output=True, text=True, timeout=300
    )
    relaxed, strict = run({}), run({REQUIRE_ENV: "1"})
    assert relaxed.returncode == 0 and "2 skipped" in relaxed.stdout, relaxed.stdout[-2000:]
    assert strict.returncode == 1 and "2 failed" in strict.stdout, strict.stdout[-2000:]
    assert f"{REQUIRE_ENV}=1 but" in strict.stdout


# ---- on an NVIDIA machine --------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("provider", [CUDA, TENSORRT])
def test_gpu_provider_runs_every_node_on_the_gpu_and_matches_the_cpu(
    provider: str, onnx_export: Path, tmp_path: Path
) -> None:
    """Where every node ran, from onnxruntime's own profile: no compute op (MatMul, Softmax, ...) on the CPU
    provider (only the shape arithmetic onnxruntime keeps there on purpose); outputs equal a CPU session's
    within a relative tolerance."""
    require_provider(provider)
    import onnxruntime as ort

    from export.onnx.verify import compare, run_all, sample_batches
    from qa_core.runtime.sessions import runner, session
    from qa_core.runtime.sidecar import Sidecar
    from qa_core.tokenizer import XLNetTokenizer

    side = Sidecar.load(onnx_export)
    cache = tmp_path / "trt-cache"
    entries = choose_providers(
        ort.get_available_providers(),
        [provider],
        profile=ProfileShapes(4, side.serving.max_seq_len),
        trt_cache_dir=cache,
    )
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "ort-profile")
    graph = onnx_export / graph_for(entries, side.model_file, side.portable_model_file)
    sess = ort.InferenceSession(str(graph), options, providers=entries)
    assert sess.get_providers()[0] == provider, sess.get_providers()
    batches = sample_batches(XLNetTokenizer.from_dir(onnx_export), [(1, 16), (3, 100), (4, 128)], seed=7)
    reference = run_all(runner(session(onnx_export / side.model_file), side.outputs), batches)
    got = run_all(runner(sess, side.outputs), batches)
    for outputs in got:
        assert all(np.isfinite(o).all() for o in outputs if o.dtype.kind == "f")
    result = compare(side.outputs, reference, got, 1e-3, exact_indices=True, relative=True)  # TF32 matmuls
    assert result.passed and not result.problems, result.problems
    events = json.loads(Path(sess.end_profiling()).read_text())
    ran = [e["args"] for e in events if e.get("cat") == "Node" and "provider" in e.get("args", {})]
    compute_on_cpu = {a["op_name"] for a in ran if a["provider"] == CPU} & COMPUTE_OPS
    assert not compute_on_cpu, f"compute ops ran on the CPU provider: {sorted(compute_on_cpu)}"
    assert any(a["provider"] == provider for a in ran), sorted({a["provider"] for a in ran})
    if provider == TENSORRT:
        assert any(cache.iterdir()), "the TensorRT provider wrote no engine/timing cache"


@pytest.mark.gpu
def test_server_on_the_tensorrt_provider_reuses_its_engine_cache(onnx_export: Path, tmp_path: Path) -> None:
    require_provider(TENSORRT)
    import httpx

    cache = tmp_path / "cache"
    flags = ("--providers", TENSORRT, "--trt-cache-dir", str(cache), "--max-batch-size", "4")
    with ServerProcess(onnx_export, tmp_path, *flags) as server:
        info = httpx.get(server.url + "/v1/model").json()["runtime"]
        assert info["providers"][0] == TENSORRT and info["model_file"] == "model.portable.onnx"
        r = httpx.post(
            server.url + "/answer", json={"question": "Who?", "context": "Ada wrote it."}, timeout=60
        )
        assert r.status_code == 200, r.text
    built = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert built
    with ServerProcess(onnx_export, tmp_path, *flags):
        pass
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir() if p.name in built} == built  # reused


def test_gpu_smoke_script_says_what_is_missing_in_one_line() -> None:
    cmd = [sys.executable, "-m", "bench.gpu_smoke", "--requests", "1"]
    proc = subprocess.run(cmd, cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])  # the stack report comes first
    if report["cuda_devices"]:
        pytest.skip("a GPU is here: the smoke script runs for real (make gpu-check)")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("python -m bench.gpu_smoke: error: the GPU stack is incomplete: ")
    assert "no CUDA GPU is visible" in lines[0] and report["pinned"]["tensorrt"]


def test_nvidia_library_directories_are_found_on_every_site_directory(tmp_path: Path) -> None:
    """onnxruntime.preload_dlls() looks only beside onnxruntime; the wheels a torch install brought may
    sit in another site directory (CUDA 13: nvidia/cu13/lib; CUDA 12: one directory per component)."""
    from qa_core.runtime.probe import nvidia_library_dirs

    torch_site, ort_site = tmp_path / "torch-site", tmp_path / "ort-target"
    for lib in ("nvidia/cu13/lib", "nvidia/cudnn/lib", "nvidia/cublas/lib", "nvidia/cuda_runtime/lib"):
        (torch_site / lib).mkdir(parents=True)
    ort_site.mkdir()
    paths = [str(ort_site), str(torch_site), str(torch_site)]
    assert nvidia_library_dirs(13, paths) == [torch_site / "nvidia/cu13/lib", torch_site / "nvidia/cudnn/lib"]
    assert nvidia_library_dirs(12, paths) == [
        torch_site / "nvidia/cublas/lib",
        torch_site / "nvidia/cuda_runtime/lib",
        torch_site / "nvidia/cudnn/lib",
    ]
    assert nvidia_library_dirs(13, [str(ort_site)]) == []
