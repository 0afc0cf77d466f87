"""TensorRT export: the missing-stack message (runs for real on machines without TensorRT or a GPU), argument
and precision-path logic, and, on an NVIDIA machine (`-m gpu`), real engines and ORT GPU providers."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from export import gpu
from export.sidecar import Sidecar
from export.trt import choose_path, main, onnx_nodes_of, parse_shape, source_graph

REPO = Path(__file__).resolve().parents[1]


def fake_onnx_export(directory: Path, **changes) -> Path:
    """An ONNX export directory as far as export.trt checks it before touching TensorRT (no real graph)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "model.portable.onnx", "spiece.model", "tokenizer_config.json"):
        (directory / name).write_bytes(b"stand-in")
    fields = dict(model_file="model.onnx", head="simple", d_model=32, n_layer=2, vocab_size=100)
    fields |= dict(backend="onnx", precision="fp32", portable_model_file="model.portable.onnx") | changes
    Sidecar(**fields).save(directory)
    return directory


def test_missing_stack_is_one_line_and_exit_2(tmp_path):
    """A real subprocess: with no tensorrt module (or no CUDA GPU) the command says which and how to fix it."""
    problem = gpu.gpu_stack_problem()
    if problem is None:
        pytest.skip("TensorRT and a CUDA GPU are present: the missing-stack path cannot happen here")
    onnx_dir = fake_onnx_export(tmp_path / "onnx")
    cmd = [sys.executable, "-m", "export.trt", "--onnx", str(onnx_dir), "--out", str(tmp_path / "trt")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("python -m export.trt: error: ") and 'pip install ".[gpu]"' in lines[0]
    which = "TensorRT is not available" if "not available" in problem else "no CUDA GPU"
    assert which in lines[0] and not (tmp_path / "trt").exists()


def test_input_errors_come_before_the_gpu_check(tmp_path, capsys):
    def error(onnx_dir: Path, *extra: str) -> str:
        assert main(["--onnx", str(onnx_dir), "--out", str(tmp_path / "trt"), *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m export.trt: error: "), lines
        return lines[0]

    assert "not an export directory" in error(tmp_path / "absent")
    assert "shorter than the export's max_seq_len 384" in error(
        fake_onnx_export(tmp_path / "a"), "--opt-shape", "8x128", "--max-shape", "8x256"
    )
    int8 = fake_onnx_export(tmp_path / "b", precision="int8", portable_model_file=None)
    assert "onnxruntime only" in error(int8)


def test_stack_check_order(monkeypatch):
    """tensorrt is checked first, then the GPU (seen through torch)."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails
    assert gpu.gpu_stack_problem().startswith("TensorRT is not available")
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.gpu_stack_problem().startswith("no CUDA GPU is available")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu.gpu_stack_problem() is None


def test_shapes_and_arguments(capsys, tmp_path):
    assert parse_shape("8x384") == [8, 384] and parse_shape("1X16") == [1, 16]
    for bad in ("8", "8x", "0x16", "axb", "1x2x3"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shape(bad)
    args = ["--onnx", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main([*args, "--min-shape", "4x16", "--opt-shape", "2x64", "--max-shape", "8x128"]) == 2
    assert "min <= opt <= max" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*args, "--max-shape", "big"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("major", "fp16", "graph", "expected"),
    [
        (10, False, "fp32", ("fp32", "fp32")),
        (10, True, "fp32", ("fp16-flag", "fp16")),
        (11, False, "fp32", ("fp32", "fp32")),
        (11, True, "fp32", ("strongly-typed", "fp16")),
        (10, False, "fp16", ("strongly-typed", "fp16")),
        (11, True, "fp16", ("strongly-typed", "fp16")),
    ],
)
def test_precision_paths(major, fp16, graph, expected):
    assert choose_path(major, fp16, graph) == expected


def test_source_graph_is_the_standard_ops_graph(tmp_path):
    side = Sidecar.load(fake_onnx_export(tmp_path / "onnx"))
    assert source_graph(tmp_path / "onnx", side) == tmp_path / "onnx" / "model.portable.onnx"
    shapes = {"min_shape": [1, 16], "opt_shape": [1, 16], "max_shape": [1, 16]}
    engine = Sidecar.from_dict(
        {**side.to_dict(), "backend": "tensorrt", "model_file": "model.engine", "trt": shapes}
    )
    with pytest.raises(ValueError, match="not an ONNX one"):
        source_graph(tmp_path, engine)


def test_layer_to_onnx_node_mapping():
    layer = types.SimpleNamespace(
        name="fused", metadata="[ONNX Layer: /t/Sin]\x1f[ONNX Layer: /t/Cos | f (g)]"
    )
    assert onnx_nodes_of(layer) == {"fused", "/t/Sin", "/t/Cos"}
    assert onnx_nodes_of(types.SimpleNamespace(name="/t/Mul")) == {"/t/Mul"}


@pytest.mark.parametrize("head", ["shallow", "beam"])
def test_padding_up_to_the_profile_minimum_changes_nothing(tmp_path, spm_dir, head):
    """TRTRunner pads batches below the engine's minimum shape; padded rows and tokens must not change the
    real outputs (checked here with onnxruntime, which accepts any shape)."""
    from export.sessions import session
    from export.testing import tiny_onnx_export
    from export.trt_runtime import _cut, pad_to
    from export.verify import sample_batches
    from train.tokenizer import XLNetTokenizer

    out = tiny_onnx_export(tmp_path / "onnx", spm_dir, head, "--no-optimize", "--no-verify")
    side = Sidecar.load(out)
    sess = session(out / "model.onnx", threads=1)
    batch = sample_batches(XLNetTokenizer.from_dir(out), [(2, 40)], seed=4)[0]
    small = dict(zip(side.outputs, sess.run(side.outputs, batch), strict=True))
    padded = pad_to(batch, (4, 64))
    assert padded["input_ids"].shape == (4, 64) and (padded["attention_mask"][2:] == 0).all()
    big = dict(zip(side.outputs, sess.run(side.outputs, padded), strict=True))
    for name in side.outputs:
        np.testing.assert_allclose(_cut(name, big[name], (2, 40)), small[name], atol=1e-5, err_msg=name)


# --- on an NVIDIA machine ------------------------------------------------------------------------------------
def require_gpu():
    pytest.importorskip(
        "tensorrt", reason="TensorRT is not installed (pip install '.[gpu]' on an NVIDIA machine)"
    )
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)")


@pytest.fixture(scope="module")
def gpu_exports(tmp_path_factory, spm_dir):
    require_gpu()
    from export.testing import tiny_onnx_export

    root = tmp_path_factory.mktemp("trt")
    return {
        head: {
            "fp32": tiny_onnx_export(root / f"{head}-fp32", spm_dir, head),
            "fp16": tiny_onnx_export(root / f"{head}-fp16", spm_dir, head, "--precision", "fp16"),
        }
        for head in ("shallow", "beam")
    }


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["shallow", "beam"])
@pytest.mark.parametrize(
    ("source", "flag", "tolerance"), [("fp32", False, 1e-3), ("fp32", True, 5e-2), ("fp16", False, 5e-2)]
)
def test_engine_matches_onnxruntime_and_pytorch(gpu_exports, tmp_path, head, source, flag, tolerance):
    from export.sessions import runner, session
    from export.trt_runtime import TRTRunner
    from export.verify import compare, run_all, sample_batches
    from train.tokenizer import XLNetTokenizer

    onnx_dir = gpu_exports[head][source]
    out, cache = tmp_path / "engine", tmp_path / "timing.cache"
    args = ["--onnx", str(onnx_dir), "--out", str(out), "--min-shape", "1x16", "--opt-shape", "2x64"]
    args += ["--max-shape", "4x384", "--timing-cache", str(cache), *(["--fp16"] if flag else [])]
    assert main(args) == 0
    side = Sidecar.load(out)
    assert side.backend == "tensorrt" and side.verification["passed"] and cache.stat().st_size > 0
    assert side.precision == ("fp16" if flag or source == "fp16" else "fp32")
    assert side.trt["path"] in ("fp32", "fp16-flag", "strongly-typed") and side.trt["version"]
    engine = TRTRunner(out)
    batches = sample_batches(XLNetTokenizer.from_dir(out), [(1, 16), (3, 100), (4, 384)], seed=5)
    fp32_graph = gpu_exports[head]["fp32"] / "model.portable.onnx"  # same seed, same weights: the fp32 truth
    reference = run_all(runner(session(fp32_graph), side.outputs), batches)
    exact = side.precision == "fp32"
    result = compare(
        side.outputs, reference, run_all(engine.runner(), batches), tolerance, exact_indices=exact
    )
    assert all(d <= tolerance for d in result.max_abs_diff.values()), result.max_abs_diff
    out_arrays = engine.run(*(batches[1][n] for n in ("input_ids", "attention_mask", "token_type_ids")))
    assert list(out_arrays) == side.outputs and all(isinstance(v, np.ndarray) for v in out_arrays.values())
    short = engine.run(*(batches[0][n][:, :9] for n in ("input_ids", "attention_mask", "token_type_ids")))
    assert all(v.shape[0] == 1 for v in short.values())  # below the profile's 16 tokens: padded, then cut
    with pytest.raises(ValueError, match="outside the engine's profile"):
        engine.run(*(np.ones((8, 16), dtype=np.int64) for _ in range(3)))
    assert main([*args, "--out", str(tmp_path / "again")]) == 0  # the saved timing cache is loaded and reused


@pytest.mark.gpu
@pytest.mark.parametrize("provider", ["CUDAExecutionProvider", "TensorrtExecutionProvider"])
def test_onnxruntime_gpu_provider_is_really_used(tmp_path, spm_dir, provider):
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        pytest.skip(f"{provider} is not in this onnxruntime build (pip install onnxruntime-gpu)")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)")
    from export.testing import tiny_onnx_export
    from export.verify import sample_batches
    from train.tokenizer import XLNetTokenizer

    out = tiny_onnx_export(tmp_path / "onnx", spm_dir, "shallow")
    batch = sample_batches(XLNetTokenizer.from_dir(out), [(2, 64)])[0]
    for name in ("model.portable.onnx", "model.onnx"):  # standard ops, and with onnxruntime contrib ops
        sess = ort.InferenceSession(str(out / name), providers=[provider, "CPUExecutionProvider"])
        assert provider in sess.get_providers(), (
            name,
            sess.get_providers(),
        )  # registered, not just available
        assert all(np.isfinite(o).all() for o in sess.run(None, batch))
