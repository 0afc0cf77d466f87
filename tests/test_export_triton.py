"""Triton model repository: config.pbtxt parsed back and checked field by field against the sidecar, for
an ONNX export and a TensorRT export (whose engine bytes are only copied, so no GPU is needed), and read
by Triton's own model-config schema; plans that Triton could not load (another TensorRT release) or serve
at every size (profile above 1) refused."""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from export.triton import pbtxt
from export.triton.cli import main
from export.triton.repository import TritonOptions, write_repository
from export.trt.profile import min_sequence
from harness.tiny_models import tiny_onnx_export
from qa_core.contract import INDEX_OUTPUTS, INPUT_NAMES
from qa_core.runtime.gpu_stacks import TENSORRT_VERSION, TRITON_GUIDANCE
from qa_core.runtime.sessions import session
from qa_core.runtime.sidecar import SIDECAR_FILE, TOKENIZER_FILES, Sidecar

SHAPES = {"opt_shape": [8, 384], "max_shape": [16, 512]}


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory, spm_dir):
    return tiny_onnx_export(
        tmp_path_factory.mktemp("triton") / "onnx", spm_dir, "beam", export={"optimize": False}
    )


@pytest.fixture(scope="module")
def trt_export(onnx_export, tmp_path_factory):
    """A TensorRT export directory as export.trt writes it, with stand-in engine bytes."""
    out = tmp_path_factory.mktemp("trt") / "trt"
    out.mkdir()
    (out / "model.engine").write_bytes(b"serialized engine stand-in")
    for name in TOKENIZER_FILES:
        shutil.copyfile(onnx_export / name, out / name)
    data = Sidecar.load(onnx_export).to_dict()
    dtypes = {n: "int64" for n in INPUT_NAMES} | {
        "start_top_log_probs": "float32",
        "start_top_index": "int32",
        "end_top_log_probs": "float32",
        "end_top_index": "int32",
        "cls_logits": "float32",
    }
    lowest = [1, min_sequence(Sidecar.load(onnx_export))]  # what export.trt builds by default
    data.update(
        backend="tensorrt",
        model_file="model.engine",
        precision="fp16",
        portable_model_file=None,
        trt={
            **SHAPES,
            "min_shape": lowest,
            "version": TENSORRT_VERSION,
            "path": "fp16-flag",
            "io_dtypes": dtypes,
        },
    )
    Sidecar.from_dict(data).save(out)
    return out


@pytest.fixture(scope="module")
def optimised_export(tmp_path_factory, spm_dir):
    """A shallow-head export with both graphs: the optimised model.onnx and the portable one."""
    return tiny_onnx_export(tmp_path_factory.mktemp("optimised") / "onnx", spm_dir, "shallow")


@pytest.fixture(scope="module")
def triton_schema() -> ModuleType:
    """Triton's model-config schema (`inference.ModelConfig`, generated from its model_config.proto) as the
    tritonclient wheel ships it. The module sits in tritonclient.grpc, whose package __init__ insists on
    grpcio (the `grpc` extra, which also caps protobuf below 7); the schema needs only protobuf, so without
    grpcio the generated file is loaded on its own."""
    pytest.importorskip("google.protobuf")
    tritonclient = pytest.importorskip("tritonclient")
    try:
        from tritonclient.grpc import model_config_pb2
    except (ImportError, RuntimeError):  # RuntimeError: "does not include grpc support"
        path = Path(tritonclient.__path__[0]) / "grpc" / "model_config_pb2.py"
        spec = importlib.util.spec_from_file_location("tritonclient_model_config_pb2", path)
        assert spec is not None and spec.loader is not None, path
        model_config_pb2 = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(model_config_pb2)
    return model_config_pb2


def trt_variant(trt_export, directory, **trt) -> str:
    """A copy of the TensorRT export with some `trt` facts changed (None removes one)."""
    shutil.copytree(trt_export, directory)
    data = json.loads((directory / SIDECAR_FILE).read_text())
    data["trt"] = {k: v for k, v in (data["trt"] | trt).items() if v is not None}
    (directory / SIDECAR_FILE).write_text(json.dumps(data))
    return str(directory)


def read_config(model_dir) -> dict:
    return pbtxt.loads((model_dir / "config.pbtxt").read_text())


def check_tensors(config: dict, sidecar: Sidecar, types: dict[str, str]) -> None:
    assert [t["name"] for t in config["input"]] == list(INPUT_NAMES)
    assert [t["name"] for t in config["output"]] == sidecar.outputs
    k1, k2 = sidecar.serving.start_n_top, sidecar.serving.end_n_top
    dims = {n: [-1] for n in INPUT_NAMES} | {"start_logits": [-1], "end_logits": [-1], "cls_logits": [1]}
    dims |= {"start_top_log_probs": [k1], "start_top_index": [k1], "end_top_log_probs": [k1 * k2]}
    dims |= {"end_top_index": [k1 * k2]}
    for tensor in config["input"] + config["output"]:
        assert tensor["dims"] == dims[tensor["name"]], tensor
        assert tensor["data_type"] == types[tensor["name"]], tensor
        assert ("reshape" in tensor) == (tensor["name"] == "cls_logits")
    cls = next(t for t in config["output"] if t["name"] == "cls_logits")
    assert cls["reshape"] == {"shape": []}


def test_onnx_repository(onnx_export, tmp_path):
    args = [
        "--onnx",
        str(onnx_export),
        "--out",
        str(tmp_path / "repo"),
        "--name",
        "qa",
        "--max-batch-size",
        "16",
    ]
    assert main([*args, "--preferred-batch", "2,8", "--max-queue-delay-us", "250", "--instances", "2"]) == 0
    model_dir = tmp_path / "repo" / "qa"
    config = read_config(model_dir)
    sidecar = Sidecar.load(onnx_export)
    assert (config["name"], config["platform"], config["max_batch_size"]) == ("qa", "onnxruntime_onnx", 16)
    assert config["dynamic_batching"] == {"preferred_batch_size": [2, 8], "max_queue_delay_microseconds": 250}
    assert config["instance_group"] == [{"count": 2, "kind": "KIND_GPU"}]
    types = {n: "TYPE_INT64" for n in INPUT_NAMES} | {n: "TYPE_FP32" for n in sidecar.outputs}
    types |= {"start_top_index": "TYPE_INT64", "end_top_index": "TYPE_INT64"}
    check_tensors(config, sidecar, types)
    assert (model_dir / "1" / "model.onnx").read_bytes() == (onnx_export / "model.onnx").read_bytes()
    served = Sidecar.load(model_dir)  # the client-side sidecar: model_file points into the version dir
    assert served.model_file == "1/model.onnx" and served.extra["triton"]["platform"] == "onnxruntime_onnx"
    assert served.settings == sidecar.settings and served.outputs == sidecar.outputs
    assert set(served.files_sha256 or {}) == {"1/model.onnx", *TOKENIZER_FILES}  # every file it serves
    assert served.file_problems(model_dir) == []
    for name in TOKENIZER_FILES:
        assert (model_dir / name).read_bytes() == (onnx_export / name).read_bytes()
    sess = session(model_dir / "1" / "model.onnx", threads=1)  # what Triton's onnxruntime backend loads
    assert [o.name for o in sess.get_outputs()] == sidecar.outputs
    assert pbtxt.loads(pbtxt.dumps(config)) == config


def test_tensorrt_repository(onnx_export, trt_export, tmp_path, capsys):
    args = ["--onnx", str(onnx_export), "--trt", str(trt_export), "--out", str(tmp_path / "repo")]
    assert main([*args, "--max-batch-size", "16"]) == 0
    assert TRITON_GUIDANCE in capsys.readouterr().out
    model_dir = tmp_path / "repo" / "xlnet_qa"
    config = read_config(model_dir)
    sidecar = Sidecar.load(trt_export)
    assert (config["platform"], config["max_batch_size"]) == ("tensorrt_plan", 16)
    types = {n: "TYPE_INT64" for n in INPUT_NAMES} | {n: "TYPE_FP32" for n in sidecar.outputs}
    types |= {"start_top_index": "TYPE_INT32", "end_top_index": "TYPE_INT32"}  # the engine's own I/O types
    check_tensors(config, sidecar, types)
    assert (model_dir / "1" / "model.plan").read_bytes() == b"serialized engine stand-in"
    served = json.loads((model_dir / SIDECAR_FILE).read_text())
    assert served["backend"] == "trt" and served["model_file"] == "1/model.plan"
    assert served["trt"]["max_shape"] == SHAPES["max_shape"]
    assert served["triton"]["tensorrt"] == TENSORRT_VERSION


def test_tensorrt_plans_triton_cannot_load_or_serve_are_refused(onnx_export, trt_export, tmp_path, capsys):
    def write(trt_dir: str, *extra: str) -> tuple[int, str]:
        args = ["--onnx", str(onnx_export), "--trt", trt_dir, "--out", str(tmp_path / "repo")]
        code = main([*args, "--max-batch-size", "16", *extra])
        return code, capsys.readouterr().err.strip()

    def refused(trt_dir: str, *extra: str) -> str:
        code, err = write(trt_dir, *extra)
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("python -m export.triton: error: "), err
        return lines[0]

    older = trt_variant(trt_export, tmp_path / "older", version="10.9.0.34")
    line = refused(older)
    assert (
        "built with TensorRT 10.9.0.34 but Triton (--triton-tensorrt) has TensorRT " + TENSORRT_VERSION
        in line
    )
    assert "python -m export.trt" in line
    assert write(older, "--triton-tensorrt", "10.9.0")[0] == 0  # a container with that TensorRT
    assert "built with TensorRT 10.14.1.48" in refused(str(trt_export), "--triton-tensorrt", "10.13.3")
    other_build = trt_variant(trt_export, tmp_path / "build", version="10.14.1.7")
    assert write(other_build)[0] == 0  # the build number does not change the plan format
    assert "records no trt.version" in refused(trt_variant(trt_export, tmp_path / "none", version=None))
    need = min_sequence(Sidecar.load(onnx_export))
    for lowest in ([2, need], [1, 16]):
        line = refused(trt_variant(trt_export, tmp_path / f"min{lowest[0]}x{lowest[1]}", min_shape=lowest))
        assert f"profile starts at {lowest[0]}x{lowest[1]}" in line and "rejects (does not pad)" in line
        assert f"--min-shape 1x{need}" in line
    with pytest.raises(SystemExit) as exc:
        main(["--onnx", str(onnx_export), "--out", str(tmp_path / "repo"), "--triton-tensorrt", "10.14"])
    assert exc.value.code == 2 and "MAJOR.MINOR.PATCH" in capsys.readouterr().err


def test_repository_errors(onnx_export, trt_export, tmp_path, capsys):
    def error(*args: str) -> str:
        assert main(["--onnx", str(onnx_export), "--out", str(tmp_path / "repo"), *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m export.triton: error: ")
        return lines[0]

    assert "exceed --max-batch-size 4" in error("--max-batch-size", "4", "--preferred-batch", "2,8")
    assert "exceeds the engine's profile (16)" in error("--trt", str(trt_export))
    assert "must be gpu" in error("--trt", str(trt_export), "--max-batch-size", "8", "--instance-kind", "cpu")
    assert "is a 'onnx' export" in error("--trt", str(onnx_export))
    assert "plain directory name" in error("--name", "a/b")
    assert main(["--onnx", str(tmp_path / "absent"), "--out", str(tmp_path / "repo")]) == 2
    assert "not an export directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--onnx", str(onnx_export), "--out", str(tmp_path / "repo"), "--preferred-batch", "a,b"])
    assert not (tmp_path / "repo" / "xlnet_qa").exists()


def test_the_repository_as_a_library(onnx_export, tmp_path, capsys):
    """TritonOptions without argparse: checked on construction, the default preferred batches resolved,
    progress to `report` and nothing printed."""
    options = TritonOptions(onnx=onnx_export, out=tmp_path / "repo", max_batch_size=8, instance_kind="cpu")
    assert options.preferred == [4, 8]
    lines: list[str] = []
    model_dir = write_repository(options, report=lines.append)
    assert capsys.readouterr() == ("", "") and lines == [
        f"wrote {model_dir}/: config.pbtxt (onnxruntime_onnx), 1/model.onnx, {SIDECAR_FILE}, tokenizer"
    ]
    assert model_dir == tmp_path / "repo" / "xlnet_qa" and (model_dir / "1" / "model.onnx").is_file()
    for bad, message in (
        ({"name": "a/b"}, "plain directory name"),
        ({"triton_tensorrt": "10.14"}, "MAJOR.MINOR.PATCH"),
        ({"instance_kind": "tpu"}, "--instance-kind must be one of"),
        ({"preferred_batch": [16]}, "exceed --max-batch-size 8"),
    ):
        with pytest.raises(ValueError, match=message):
            TritonOptions(onnx=onnx_export, out=tmp_path / "repo", max_batch_size=8, **bad)


def test_gpu_instances_get_the_portable_graph(optimised_export, spm_dir, tmp_path, capsys):
    """GPU instances load the standard-ops graph (the optimised model.onnx has onnxruntime CPU contrib ops),
    CPU instances the optimised one; an int8 export on GPU instances is refused."""
    import onnx

    export = optimised_export  # optimised: both graphs
    side = Sidecar.load(export)
    assert side.portable_model_file and side.portable_model_file != side.model_file

    def domains(repo):
        return {
            n.domain or "ai.onnx" for n in onnx.load(str(repo / "xlnet_qa" / "1" / "model.onnx")).graph.node
        }

    assert main(["--onnx", str(export), "--out", str(tmp_path / "gpu")]) == 0
    assert domains(tmp_path / "gpu") == {"ai.onnx"}
    served = json.loads((tmp_path / "gpu" / "xlnet_qa" / SIDECAR_FILE).read_text())
    assert served["triton"]["source_graph"] == side.portable_model_file
    assert main(["--onnx", str(export), "--out", str(tmp_path / "cpu"), "--instance-kind", "cpu"]) == 0
    assert "com.microsoft" in domains(tmp_path / "cpu")
    int8 = tiny_onnx_export(
        tmp_path / "int8", spm_dir, "shallow", export={"precision": "int8", "verify": False}
    )
    capsys.readouterr()
    assert main(["--onnx", str(int8), "--out", str(tmp_path / "int8-gpu")]) == 2
    assert "--instance-kind cpu" in capsys.readouterr().err and not (tmp_path / "int8-gpu").exists()


def schema_view(config: Any, schema: ModuleType) -> dict[str, Any]:
    """What Triton read from config.pbtxt, in the shape `pbtxt.loads` gives (enums by name)."""

    def tensor(t: Any) -> dict[str, Any]:
        view = {"name": t.name, "data_type": schema.DataType.Name(t.data_type), "dims": list(t.dims)}
        if t.HasField("reshape"):
            view["reshape"] = {"shape": list(t.reshape.shape)}
        return view

    batching = config.dynamic_batching
    return {
        "name": config.name,
        "platform": config.platform,
        "max_batch_size": config.max_batch_size,
        "input": [tensor(t) for t in config.input],
        "output": [tensor(t) for t in config.output],
        "dynamic_batching": {
            "preferred_batch_size": list(batching.preferred_batch_size),
            "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
        },
        "instance_group": [
            {"count": g.count, "kind": schema.ModelInstanceGroup.Kind.Name(g.kind)}
            for g in config.instance_group
        ],
    }


@dataclass(frozen=True)
class SchemaCase:
    """One repository to read with Triton's schema: what to write it from, and what it must hold."""

    export: str  # the fixture with the export (a TensorRT one is written with the ONNX export beside it)
    args: tuple[str, ...] = ()
    name: str = "xlnet_qa"
    platform: str = "onnxruntime_onnx"
    max_batch: int = 32
    preferred: tuple[int, ...] = (4, 8, 16)
    delay_us: int = 500
    kind: str = "KIND_GPU"
    count: int = 1
    index_type: str = "TYPE_INT64"  # the beam head's top-k indices: int64 in ONNX, the engine's own int32


SCHEMA_CASES = {
    "onnx": SchemaCase(
        "onnx_export",
        ("--name", "qa", "--max-batch-size", "16", "--preferred-batch", "2,8", "--instances", "2"),
        name="qa",
        max_batch=16,
        preferred=(2, 8),
        count=2,
    ),
    "tensorrt": SchemaCase(
        "trt_export",
        ("--max-batch-size", "16"),
        platform="tensorrt_plan",
        max_batch=16,
        index_type="TYPE_INT32",
    ),
    "onnx-gpu-instances": SchemaCase("optimised_export"),
    "onnx-cpu-instances": SchemaCase(
        "optimised_export",
        ("--instance-kind", "cpu", "--max-queue-delay-us", "0"),
        delay_us=0,
        kind="KIND_CPU",
    ),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_config_parses_with_tritons_model_config_schema(case, request, onnx_export, triton_schema, tmp_path):
    """Triton's own schema (protobuf text format into inference.ModelConfig, which rejects unknown fields,
    unknown enum names and mistyped values, where our parser takes any identifier) reads config.pbtxt as
    our parser does, with the platform, batching, tensors and instances the writer meant and nothing else."""
    from google.protobuf import text_format

    want = SCHEMA_CASES[case]
    source = request.getfixturevalue(want.export)
    if want.export == "trt_export":
        args = ["--onnx", str(onnx_export), "--trt", str(source)]
    else:
        args = ["--onnx", str(source)]
    assert main([*args, "--out", str(tmp_path / "repo"), *want.args]) == 0
    model_dir = tmp_path / "repo" / want.name
    text = (model_dir / "config.pbtxt").read_text()
    config = text_format.Parse(text, triton_schema.ModelConfig())

    view = schema_view(config, triton_schema)
    assert view == read_config(model_dir)  # the same reading, field for field
    assert {field.name for field, _ in config.ListFields()} == {
        "name",
        "platform",
        "max_batch_size",
        "input",
        "output",
        "dynamic_batching",
        "instance_group",
    }  # no backend, optimization, parameters, version policy or warmup: Triton's defaults
    assert (config.name, config.platform, config.backend) == (want.name, want.platform, "")
    assert config.max_batch_size == want.max_batch
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    batching = config.dynamic_batching
    assert tuple(batching.preferred_batch_size) == want.preferred
    assert batching.max_queue_delay_microseconds == want.delay_us
    (group,) = config.instance_group
    assert (group.kind, group.count) == (triton_schema.ModelInstanceGroup.Kind.Value(want.kind), want.count)
    sidecar = Sidecar.load(source)
    types = {n: "TYPE_INT64" for n in INPUT_NAMES} | {n: "TYPE_FP32" for n in sidecar.outputs}
    types |= {n: want.index_type for n in INDEX_OUTPUTS if n in sidecar.outputs}
    check_tensors(view, sidecar, types)
    assert all(t.data_type == triton_schema.TYPE_INT64 for t in config.input)
    with pytest.raises(text_format.ParseError):  # what our lenient parser would let through
        text_format.Parse(text.replace("TYPE_FP32", "TYPE_FLOAT32", 1), triton_schema.ModelConfig())


def test_pbtxt_subset():
    text = """
    # comment
    name: "m"  max_batch_size: 8
    input [ { name: "a" dims: [ -1, 3 ] }, { name: "b\\"q" dims: [] } ]
    dynamic_batching { preferred_batch_size: [ 4 ] flag: true }
    instance_group { kind: KIND_GPU }
    instance_group { kind: KIND_CPU }
    """
    parsed = pbtxt.loads(text)
    assert parsed == {
        "name": "m",
        "max_batch_size": 8,
        "input": [{"name": "a", "dims": [-1, 3]}, {"name": 'b"q', "dims": []}],
        "dynamic_batching": {"preferred_batch_size": [4], "flag": True},
        "instance_group": [{"kind": "KIND_GPU"}, {"kind": "KIND_CPU"}],
    }
    assert pbtxt.loads(pbtxt.dumps(parsed)) == parsed
    with pytest.raises(ValueError, match="pbtxt"):
        pbtxt.loads('name: "x" }')
