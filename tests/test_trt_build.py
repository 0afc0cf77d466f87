"""TensorRT engine builder: the command line without a GPU (the missing-stack message runs for real on
machines without TensorRT or a GPU), the options and the profile checked against the export, the precision
paths, the fp16 path's fp32 island, the timing cache, builds on a stand-in TensorRT, and, on an NVIDIA
machine (`-m gpu`), real engines checked against PyTorch fp32. The runtime side: test_trt_runtime.py."""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from paths import REPO
from trt_stand_in import STRONGLY_TYPED, StandInBuilderConfig

from export.trt.build import (
    StackUnavailable,
    TrtBuildOptions,
    build_trt,
    choose_path,
    keep_fp32,
    load_timing_cache,
    onnx_nodes_of,
    save_timing_cache,
)
from export.trt.cli import main, shape_flag
from export.trt.profile import (
    Profile,
    check_profile_fits,
    min_sequence,
    parse_shape,
    position_limit,
    source_graph,
)
from qa_core.runtime import gpu
from qa_core.runtime.gpu_stacks import TENSORRT_VERSION, tensorrt_release
from qa_core.runtime.sidecar import TOKENIZER_FILES, Sidecar


def position_graph(
    limit: int = 512, d_model: int = 32, n_head: int = 4, via_cast: bool = False, fused: bool = True
) -> onnx.ModelProto:
    """A graph holding what export.trt reads of a real export: a [1, n_head, 2 x limit, d_head + 1]
    position table (d_head before the fused layer's position-bias column) sliced by the sequence length
    (as `QAInference`'s cached positions are)."""
    shape = (1, n_head, 2 * limit, d_model // n_head + (1 if fused else 0))
    table = numpy_helper.from_array(np.zeros(shape, np.float32), "table")
    starts = numpy_helper.from_array(np.array([0], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([2], np.int64), "ends")
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes")
    nodes = [helper.make_node("Cast", ["table"], ["table16"], to=TensorProto.FLOAT16)] if via_cast else []
    nodes.append(
        helper.make_node("Slice", ["table16" if via_cast else "table", "starts", "ends", "axes"], ["out"])
    )
    out_type = TensorProto.FLOAT16 if via_cast else TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "positions",
        [],
        [helper.make_tensor_value_info("out", out_type, None)],
        initializer=[table, starts, ends, axes],
    )
    return helper.make_model(graph)


def fake_onnx_export(directory: Path, limit: int = 512, **changes: Any) -> Path:
    """An ONNX export directory as far as export.trt checks it before touching TensorRT (a stand-in graph
    with a position table, no model)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "model.portable.onnx"):
        onnx.save(position_graph(limit), str(directory / name))
    for name in TOKENIZER_FILES:
        (directory / name).write_bytes(b"stand-in")
    fields = dict(model_file="model.onnx", head="simple", d_model=32, n_layer=2, vocab_size=100)
    fields |= dict(backend="onnx", precision="fp32", portable_model_file="model.portable.onnx") | changes
    Sidecar.from_dict(fields).save(directory)
    return directory


# --- the command line without a GPU ------------------------------------------------------------------------
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
    assert (
        lines[0].startswith("python -m export.trt: error: ") and 'pip install ".[gpu,tensorrt]"' in lines[0]
    )
    which = next(w for w in ("TensorRT is not available", "cuda-bindings", "no CUDA GPU") if w in problem)
    assert which in lines[0] and not (tmp_path / "trt").exists()


def test_input_errors_come_before_the_gpu_check(tmp_path, capsys):
    def error(onnx_dir: Path, *extra: str) -> str:
        assert main(["--onnx", str(onnx_dir), "--out", str(tmp_path / "trt"), *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m export.trt: error: "), lines
        return lines[0]

    assert "not an export directory" in error(tmp_path / "absent")
    plain = fake_onnx_export(tmp_path / "a")
    assert "shorter than the export's max_seq_len 384" in error(
        plain, "--opt-shape", "8x128", "--max-shape", "8x256"
    )
    line = error(plain, "--max-shape", "8x600")
    assert "exceeds the 512 positions the exported graph holds" in line and "--max-shape 8x512" in line
    assert "exceeds the 400 positions" in error(fake_onnx_export(tmp_path / "short", limit=400))
    beam = fake_onnx_export(tmp_path / "beam", head="beam", start_n_top=5, end_n_top=4)
    line = error(beam, "--min-shape", "1x4")
    assert "shorter than the graph runs (5 tokens" in line and "--min-shape 1x5" in line
    int8 = fake_onnx_export(tmp_path / "b", precision="int8", portable_model_file=None)
    assert "onnxruntime only" in error(int8)
    (plain / "model.portable.onnx").write_bytes(b"not a protobuf \xff\xff")
    line = error(plain)
    assert "cannot read" in line and "as an ONNX model" in line


def test_shapes_and_arguments(capsys, tmp_path):
    assert parse_shape("8x384") == (8, 384) and parse_shape("1X16") == (1, 16)
    assert shape_flag("8x384") == (8, 384)
    for bad in ("8", "8x", "0x16", "axb", "1x2x3"):
        with pytest.raises(ValueError, match="expected BATCHxSEQUENCE like 8x384"):
            parse_shape(bad)
        with pytest.raises(argparse.ArgumentTypeError, match="expected BATCHxSEQUENCE like 8x384"):
            shape_flag(bad)
    args = ["--onnx", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main([*args, "--min-shape", "4x16", "--opt-shape", "2x64", "--max-shape", "8x128"]) == 2
    assert "min <= opt <= max" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*args, "--max-shape", "big"])
    assert exc.value.code == 2


def test_default_minimum_is_the_smallest_shape_the_graph_accepts(tmp_path):
    """1x4 (the graph's position chunks each need a row), or 1xk for a beam head with k > 4 (its top-k
    over the sequence needs k tokens): Triton does not pad."""
    assert min_sequence(Sidecar.load(fake_onnx_export(tmp_path / "s"))) == 4
    beam = Sidecar.load(fake_onnx_export(tmp_path / "b", head="beam", start_n_top=5, end_n_top=3))
    assert min_sequence(beam) == 5


@pytest.mark.parametrize(
    ("release", "fp16", "graph", "expected"),
    [
        ((10, 11, 0), False, "fp32", ("fp32", "fp32")),
        ((10, 11, 0), True, "fp32", ("fp16-flag", "fp16")),  # before 10.12 deprecated weak typing
        ((10, 0, 1), True, "fp32", ("fp16-flag", "fp16")),
        ((10, 12, 0), True, "fp32", ("strongly-typed", "fp16")),
        ((10, 14, 1), True, "fp32", ("strongly-typed", "fp16")),  # the pinned release
        ((10, 14, 1), False, "fp32", ("fp32", "fp32")),
        ((11, 0, 0), False, "fp32", ("fp32", "fp32")),
        ((11, 0, 0), True, "fp32", ("strongly-typed", "fp16")),
        ((10, 11, 0), False, "fp16", ("strongly-typed", "fp16")),  # an fp16 graph, on any release
        ((11, 0, 0), True, "fp16", ("strongly-typed", "fp16")),
    ],
)
def test_precision_paths(release, fp16, graph, expected):
    assert choose_path(release, fp16, graph) == expected


def test_the_pinned_tensorrt_builds_fp16_strongly_typed():
    assert choose_path(tensorrt_release(TENSORRT_VERSION), True, "fp32") == ("strongly-typed", "fp16")


def test_source_graph_is_the_standard_ops_graph(tmp_path):
    side = Sidecar.load(fake_onnx_export(tmp_path / "onnx"))
    assert source_graph(tmp_path / "onnx", side) == tmp_path / "onnx" / "model.portable.onnx"
    shapes = {"min_shape": [1, 16], "opt_shape": [1, 16], "max_shape": [1, 16]}
    engine = Sidecar.from_dict(
        {**side.to_dict(), "backend": "tensorrt", "model_file": "model.engine", "trt": shapes}
    )
    with pytest.raises(ValueError, match="not an ONNX one"):
        source_graph(tmp_path, engine)


def test_position_limit_of_a_graph():
    assert position_limit(position_graph(512), 32) == 512
    assert position_limit(position_graph(300, via_cast=True), 32) == 300  # an fp16 graph casting the table
    assert position_limit(position_graph(512), 64) is None  # not this model's table
    assert (
        position_limit(position_graph(384, fused=False), 32) == 384
    )  # an export made before the fused layer
    assert position_limit(position_graph(384, fused=False), 64) is None
    no_table = helper.make_model(helper.make_graph([], "empty", [], []))
    assert position_limit(no_table, 32) is None


# --- the fp16 path's fp32 island ------------------------------------------------------------------------------
def test_layer_to_onnx_node_mapping():
    layer = types.SimpleNamespace(
        name="fused", metadata="[ONNX Layer: /t/Sin]\x1f[ONNX Layer: /t/Cos | f (g)]"
    )
    assert onnx_nodes_of(layer) == {"fused", "/t/Sin", "/t/Cos"}
    assert onnx_nodes_of(types.SimpleNamespace(name="/t/Mul")) == {"/t/Mul"}


class FakeLayer:
    def __init__(self, name: str, out_type: str) -> None:
        self.name, self.precision, self.num_outputs = name, None, 1
        self.output = types.SimpleNamespace(dtype=out_type)
        self.set_types: dict[int, str] = {}

    def get_output(self, j: int) -> Any:
        return self.output

    def set_output_type(self, j: int, dtype: str) -> None:
        self.set_types[j] = dtype


def test_keep_fp32_warns_only_when_an_island_matches_nothing(capsys):
    trt = types.SimpleNamespace(float32="f32", float16="f16")
    layers = [FakeLayer("/pos/Sin", "f16"), FakeLayer("/x/MatMul", "f16")]
    network = types.SimpleNamespace(num_layers=2, get_layer=lambda i: layers[i])
    assert keep_fp32(network, set(), trt) == 0  # what every QAInference export has: tables are constants
    out = capsys.readouterr()
    assert "no sinusoid nodes" in out.out and "WARNING" not in out.err
    assert keep_fp32(network, {"/other/Cos"}, trt) == 0
    assert "WARNING: none of the 1 sinusoid nodes matched" in capsys.readouterr().err
    assert keep_fp32(network, {"/pos/Sin"}, trt) == 1
    assert layers[0].precision == "f32" and layers[0].set_types == {0: "f32"} and layers[1].precision is None


def test_the_exported_graph_has_no_sinusoid_island_and_a_512_position_table(tmp_path, spm_dir):
    """Why the fp16 build has nothing to constrain: QAInference bakes the positions into constant tables."""
    from export.onnx.graph import fp32_island
    from harness.tiny_models import tiny_onnx_export
    from train.model.inference import MAX_POSITIONS

    out = tiny_onnx_export(tmp_path / "onnx", spm_dir, "shallow", export={"optimize": False, "verify": False})
    model = onnx.load(str(out / "model.onnx"))
    assert fp32_island(model) == []
    assert position_limit(model, Sidecar.load(out).d_model) == MAX_POSITIONS


# --- the timing cache ------------------------------------------------------------------------------------------
def test_timing_cache_from_another_tensorrt_starts_empty(tmp_path, capsys):
    cache = tmp_path / "timing.cache"
    config = StandInBuilderConfig(accepts=b"ours")
    timing = load_timing_cache(config, None)
    assert timing.state == "empty" and config.attached is timing.cache and timing.cache.data == b""
    timing = load_timing_cache(config, cache)
    assert timing.state == "empty"  # no file yet
    assert save_timing_cache(config, cache, "empty") and cache.read_bytes() == b"+tuned"
    assert "timing cache written" in capsys.readouterr().out
    cache.write_bytes(b"ours")
    timing = load_timing_cache(config, cache)
    assert timing.state == "loaded" and config.attached is timing.cache and timing.cache.data == b"ours"
    assert "timing cache loaded" in capsys.readouterr().out
    for foreign in (b"theirs", b"garbage"):  # refused by set_timing_cache / no cache from create_timing_cache
        cache.write_bytes(foreign)
        timing = load_timing_cache(config, cache)
        assert timing.state == "replaced" and config.attached is timing.cache and timing.cache.data == b""
        err = capsys.readouterr().err
        assert f"timing cache {cache} was made by another TensorRT/GPU; starting with an empty one" in err
    assert save_timing_cache(config, cache, "replaced") and cache.read_bytes() == b"+tuned"


def test_the_config_does_not_keep_the_timing_cache_alive():
    """Why load_timing_cache returns the cache: TensorRT's config keeps no ownership of it (nor does the
    stand-in), so a cache nobody holds is gone before the build that should use it."""
    config = StandInBuilderConfig()
    timing = load_timing_cache(config, None)
    assert config.attached is not None
    del timing
    gc.collect()
    assert config.attached is None


def test_no_timing_cache_after_the_build_is_a_warning(tmp_path, capsys):
    cache = tmp_path / "timing.cache"
    config = StandInBuilderConfig(accepts=b"ours")
    timing = load_timing_cache(config, cache)
    config.no_cache_after_build = True
    assert not save_timing_cache(config, cache, timing.state) and not cache.exists()
    assert "returned no timing cache" in capsys.readouterr().err


# --- the build command on the stand-in builder -------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "fp16", "path"),
    [
        (TENSORRT_VERSION, True, "strongly-typed"),
        ("10.11.0.33", True, "fp16-flag"),
        (TENSORRT_VERSION, False, "fp32"),
        ("11.0.0.114", True, "strongly-typed"),
    ],
)
def test_build_command_on_the_stand_in_builder(tmp_path, capsys, stand_in_stack, version, fp16, path):
    """``python -m export.trt`` end to end on the stand-in TensorRT: the network flags and builder flags of
    each precision path, the graph the parser read (fp16 for strongly typed --fp16 builds), the timing
    cache attached and still alive while the engine builds, then saved, and the export directory."""
    stand_in_stack(version=version)
    onnx_dir = fake_onnx_export(tmp_path / "onnx", head="shallow")
    out, cache = tmp_path / "engine", tmp_path / "timing.cache"
    args = ["--onnx", str(onnx_dir), "--out", str(out), "--timing-cache", str(cache), "--no-verify"]
    assert main([*args, *(["--fp16"] if fp16 else [])]) == 0
    assert f"via the {path!r} path" in capsys.readouterr().out
    (builder,) = sys.modules["tensorrt"].builders
    (build,) = builder.builds
    assert build["timing_cache_alive"] and cache.read_bytes() == b"+tuned"
    strongly = path == "strongly-typed"
    assert build["network_flags"] == (1 << STRONGLY_TYPED if strongly else 0)
    assert ("FP16" in build["config_flags"]) == (path == "fp16-flag")
    assert ("PREFER_PRECISION_CONSTRAINTS" in build["config_flags"]) == (path == "fp16-flag")
    table = next(init for init in build["graph"].graph.initializer if init.name == "table")
    assert table.data_type == (TensorProto.FLOAT16 if strongly else TensorProto.FLOAT)
    assert build["graph_file"] == ("model.fp16.onnx" if strongly else "model.portable.onnx")
    side = Sidecar.load(out)
    assert (side.backend, side.precision) == ("trt", "fp16" if fp16 else "fp32")
    assert side.trt["path"] == path and side.trt["version"] == version
    assert side.trt["source_onnx"] == build["graph_file"] and side.trt["device"] == "Stand-in GPU 0"
    assert side.trt["timing_cache"] == str(cache) and (out / "model.engine").is_file()


def test_to_fp16_keeps_the_sinusoid_island_fp32():
    """The strongly typed fp16 build keeps the types of the converted graph: a graph that computes its
    sinusoids keeps those nodes, and the values between them, in fp32 (angles of positions in the
    hundreds have no fractional part left in fp16); the rest becomes fp16."""
    import onnxruntime as ort

    from export.onnx.graph import fp32_island
    from export.onnx.precision import to_fp16

    weight = numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "weight")
    freq = numpy_helper.from_array(np.array([[1.0, 0.5, 0.25, 0.1]], np.float32), "freq")
    nodes = [
        helper.make_node("Mul", ["pos", "freq"], ["angle"], name="/pos/Mul"),
        helper.make_node("Sin", ["angle"], ["sin"], name="/pos/Sin"),
        helper.make_node("Cos", ["angle"], ["cos"], name="/pos/Cos"),
        helper.make_node("Concat", ["sin", "cos"], ["table"], axis=0, name="/pos/Concat"),
        helper.make_node("MatMul", ["table", "weight"], ["out"], name="/x/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "sinusoids",
        [helper.make_tensor_value_info("pos", TensorProto.FLOAT, [4, 1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [8, 4])],
        initializer=[weight, freq],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    island = set(fp32_island(model))
    assert island == {"/pos/Mul", "/pos/Sin", "/pos/Cos", "/pos/Concat"}
    converted = to_fp16(model)
    inits = {init.name: init.data_type for init in converted.graph.initializer}
    assert inits == {"freq": TensorProto.FLOAT, "weight": TensorProto.FLOAT16}
    producer = {out: node for node in converted.graph.node for out in node.output}
    by_name = {node.name: node for node in converted.graph.node}
    assert island <= set(by_name)
    for name in island:  # island nodes read the graph input, constants or each other: no fp16 round trip
        for value in by_name[name].input:
            assert value in ("pos", "freq") or producer[value].name in island, (name, value)
    matmul = by_name["/x/MatMul"]
    assert producer[matmul.input[0]].op_type == "Cast"  # the fp32 table enters the fp16 MatMul cast
    positions = {"pos": np.array([[0.0], [100.3], [300.7], [500.9]], np.float32)}
    expected = ort.InferenceSession(model.SerializeToString()).run(None, positions)[0]
    got = ort.InferenceSession(converted.SerializeToString()).run(None, positions)[0]
    assert got.dtype == np.float32 and np.abs(got - expected).max() < 5e-3


# --- the builder as a library --------------------------------------------------------------------------------
def test_options_are_checked_on_construction(tmp_path):
    """The builder's options without argparse: the flags' rules hold for a library caller too."""
    options = TrtBuildOptions(onnx=tmp_path, out=tmp_path / "o", opt_shape=(2, 64), max_shape=(4, 128))
    assert options.opt_shape == (2, 64) and options.min_shape is None and options.verify
    with pytest.raises(ValueError, match="min <= opt <= max"):
        TrtBuildOptions(onnx=tmp_path, out=tmp_path / "o", min_shape=(4, 16), opt_shape=(2, 64))
    with pytest.raises(ValueError, match="--workspace-gb must be positive"):
        TrtBuildOptions(onnx=tmp_path, out=tmp_path / "o", workspace_gb=0)
    beam = Sidecar.load(fake_onnx_export(tmp_path / "beam", head="beam", start_n_top=5, end_n_top=4))
    assert options.profile(beam) == Profile((1, 5), (2, 64), (4, 128))
    assert options.profile(beam).record() == {
        "min_shape": [1, 5],
        "opt_shape": [2, 64],
        "max_shape": [4, 128],
    }
    shallow = Sidecar.load(fake_onnx_export(tmp_path / "shallow", head="shallow"))
    assert options.profile(shallow).min == (1, 4)  # the graph's 4 position chunks each need a row
    below = TrtBuildOptions(onnx=tmp_path, out=tmp_path / "o", min_shape=(1, 2), opt_shape=(2, 64))
    with pytest.raises(ValueError, match=r"shorter than the graph runs \(4 tokens.*--min-shape 1x4"):
        check_profile_fits(below.profile(shallow), shallow, None)


def test_the_builder_as_a_library_reports_through_callbacks(tmp_path, capsys, stand_in_stack):
    """build_trt on the stand-in TensorRT: progress to `report`, nothing printed, the sidecar returned."""
    stand_in_stack()
    onnx_dir = fake_onnx_export(tmp_path / "onnx", head="shallow")  # the stand-in engine's outputs
    lines: list[str] = []
    warnings: list[str] = []
    options = TrtBuildOptions(onnx=onnx_dir, out=tmp_path / "engine", verify=False)
    built = build_trt(options, report=lines.append, warn=warnings.append)
    assert capsys.readouterr() == ("", "") and warnings == []
    assert lines[0].startswith("python -m export.trt: TensorRT ") and lines[-1].startswith("wrote ")
    assert built.backend == "trt" and Sidecar.load(tmp_path / "engine").trt == built.trt
    assert built.trt["min_shape"] == [1, 4] and built.trt["path"] == "fp32"  # the graph's shortest window
    engine = Sidecar.load(tmp_path / "engine")  # the engine and the tokenizer, every one hashed
    assert set(engine.files_sha256 or {}) == set(engine.served_files()) == {"model.engine", *TOKENIZER_FILES}
    assert engine.file_problems(tmp_path / "engine") == []


def test_no_gpu_stack_is_stack_unavailable_before_anything_is_written(tmp_path, monkeypatch):
    """What the command turns into its one line and exit 2."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails
    options = TrtBuildOptions(onnx=fake_onnx_export(tmp_path / "onnx"), out=tmp_path / "engine")
    with pytest.raises(StackUnavailable, match="TensorRT is not available"):
        build_trt(options, report=lambda line: None)
    assert not (tmp_path / "engine").exists()
