"""ONNX export: every head verifies against PyTorch, HF XLNet checkpoints against transformers (the oracle),
graph content, the export.json contract and clean CLI errors (int8/fp16 agreement: test_export_onnx_precision.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from module_runs import run_module
from paths import REPO, SAMPLE_DEV

from export.onnx.cli import build_parser, main, options_from_args
from export.onnx.exporter import OnnxExportOptions, export_onnx
from export.onnx.graph import FORBIDDEN_OPS, matmul_weights, op_counts
from export.onnx.torch_export import torch_runner
from export.onnx.verify import compare, run_all, sample_batches
from harness.tiny_models import TINY, perturb, tiny_qa_checkpoint
from qa_core.contract import DEFAULTS, INPUT_NAMES
from qa_core.digests import sha256_file
from qa_core.runtime import sidecar as sc
from qa_core.runtime.sessions import runner, session
from train.model import XLNetConfig, XLNetLMHeadModel, checkpoint
from train.model.inference import QAInference, derive_p_mask, output_names

HEADS = ("simple", "shallow", "deep", "beam")
TINY_ARGS = dict(d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0)
METADATA = {"no_answer_threshold": 0.4, "max_seq_len": 256, "doc_stride": 64, "max_query_len": 32}


@pytest.fixture(scope="module")
def exports(tmp_path_factory, spm_dir):
    """One fp32 export per head (the shallow one carries fine-tuning metadata)."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for head in HEADS:
        meta = METADATA if head == "shallow" else None
        ckpt = tiny_qa_checkpoint(root / f"ckpt-{head}", spm_dir, head, metadata=meta)
        assert main(["--checkpoint", str(ckpt), "--out", str(root / head)]) == 0
        out[head] = (ckpt, root / head)
    return out


def feeds_of(batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(batch[n]) for n in INPUT_NAMES)


# --- contract -------------------------------------------------------------------------------------------
def test_sidecar_names_mirror_the_model():
    assert sc.INPUT_NAMES == INPUT_NAMES
    for head in HEADS:
        assert sc.OUTPUT_NAMES[head] == output_names(head)


@pytest.mark.parametrize("head", HEADS)
def test_every_head_exports_and_verifies(exports, head):
    ckpt, out = exports[head]
    side = sc.Sidecar.load(out)
    assert (side.backend, side.head, side.precision, side.model_file) == ("onnx", head, "fp32", "model.onnx")
    assert side.outputs == list(output_names(head)) and side.inputs == list(INPUT_NAMES)
    ver = side.verification
    assert ver["passed"] is True and ver["tolerance"] == 1e-4
    assert ver["shapes"] == [[1, 16], [2, 64], [3, 200]]
    assert max(ver["shapes"])[1] > side.exporter["trace_shape"][1] and max(b for b, _ in ver["shapes"]) > 1
    assert all(d <= 1e-4 for d in ver["max_abs_diff"].values())
    assert set(ver["max_abs_diff"]) | set(ver["fraction_equal"]) == set(side.outputs)
    assert side.source_checkpoint_sha256 == sha256_file(ckpt / "model.safetensors")
    assert side.exporter["torch"] == torch.__version__ and side.exporter["folded_ifs"] >= (head != "simple")
    cfg = checkpoint.load(ckpt).config
    assert (side.d_model, side.n_layer, side.vocab_size) == (cfg.d_model, cfg.n_layer, cfg.vocab_size)
    assert (side.serving.start_n_top, side.serving.end_n_top) == (cfg.start_n_top, cfg.end_n_top)
    expected = {**DEFAULTS.as_dict(), **(METADATA if head == "shallow" else {})}
    assert side.settings == expected
    assert (out / "spiece.model").read_bytes() == (ckpt / "spiece.model").read_bytes()
    assert (
        side.portable_model_file == "model.portable.onnx"
        and side.optimization["level"] == "ORT_ENABLE_EXTENDED"
    )


@pytest.mark.parametrize("head", HEADS)
def test_graph_content_and_dynamic_shapes(exports, head):
    """No EyeLike/OneHot/Einsum (nor control flow) anywhere; symbolic batch/sequence axes; int64 inputs;
    and both graphs match PyTorch at a shape neither the trace nor the verification used."""
    ckpt, out = exports[head]
    portable = onnx.load(str(out / "model.portable.onnx"))
    for path in (out / "model.onnx", out / "model.portable.onnx"):
        ops = op_counts(onnx.load(str(path)))
        assert not set(ops) & set(FORBIDDEN_OPS), ops
    assert not any(n.domain not in ("", "ai.onnx") for n in portable.graph.node)
    for inp in portable.graph.input:
        assert inp.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in inp.type.tensor_type.shape.dim] == ["batch", "sequence"]
    for o in portable.graph.output:
        assert o.type.tensor_type.shape.dim[0].dim_param == "batch"
    module = QAInference(checkpoint.load(ckpt).model).eval()
    batches = sample_batches(checkpoint.load(ckpt).tokenizer, [(4, 301)], seed=7)
    reference = run_all(torch_runner(module), batches)
    for path in (out / "model.onnx", out / "model.portable.onnx"):
        got = run_all(runner(session(path, threads=1), module.names), batches)
        result = compare(module.names, reference, got, 1e-4)
        assert result.passed, result.problems


SKIP_LN = "com.microsoft.SkipLayerNormalization"


def test_cpu_sessions_skip_the_slow_skiplayernorm_fusion(exports, tmp_path):
    """In the int8 graph onnxruntime would fuse the feed-forward output's residual Add + LayerNormalization
    into SkipLayerNormalization (slow on CPU: qa_core.runtime.sidecar.CPU_DISABLED_OPTIMIZERS): the shipped file and a
    CPU session's own online (ENABLE_ALL) graph keep them unfused; other providers keep the fusion."""
    ckpt, _ = exports["shallow"]
    shipped, plain = tmp_path / "int8", tmp_path / "int8-unoptimized"
    assert main(["--checkpoint", str(ckpt), "--out", str(shipped), "--precision", "int8"]) == 0
    assert main(["--checkpoint", str(ckpt), "--out", str(plain), "--precision", "int8", "--no-optimize"]) == 0
    enabled = tmp_path / "enabled.onnx"
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(enabled)
    ort.InferenceSession(str(plain / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    assert SKIP_LN in op_counts(onnx.load(str(enabled)))  # onnxruntime's default
    checked = []
    for name in ("int8", "int8-unoptimized"):
        online = tmp_path / f"{name}-online.onnx"
        session(tmp_path / name / "model.onnx", threads=1, level="all", optimized_path=online)
        checked += [tmp_path / name / "model.onnx", online]
    for path in checked:
        ops = op_counts(onnx.load(str(path)))
        assert SKIP_LN not in ops and ops["LayerNormalization"] == 2 * TINY_ARGS["n_layer"], ops
    assert sc.ort_disabled_optimizers(["CPUExecutionProvider"]) == ["SkipLayerNormFusion"]
    assert sc.ort_disabled_optimizers(["CUDAExecutionProvider", "CPUExecutionProvider"]) == []


def test_projection_weights_are_constant_initializers(exports):
    """The one input projection (q, k, v and the segment term), the output projection, feed-forward and
    heads multiply constant weights (int8 can quantize them); the position projection is a precomputed
    table (cache_positions), so there is no r MatMul; only the attention products multiply two
    activations: content scores, the position scores in POSITION_CHUNKS query chunks, and the weighted
    sum of values."""
    from train.model.fused import POSITION_CHUNKS

    ckpt, out = exports["shallow"]
    n_layer = checkpoint.load(ckpt).config.n_layer
    total, const = matmul_weights(onnx.load(str(out / "model.portable.onnx")))
    assert const == 4 * n_layer + 3  # per layer: in (q k v seg), out, ff1, ff2; heads: start end cls
    assert total - const == (2 + POSITION_CHUNKS) * n_layer


# --- HuggingFace checkpoints, checked against transformers ----------------------------------------------
def hf_directory(hf_cls, tmp_path: Path, spm: Path) -> tuple[torch.nn.Module, Path]:
    cfg = transformers.XLNetConfig(vocab_size=2000, **TINY)
    torch.manual_seed(0)
    hf = perturb(hf_cls(cfg)).eval()
    hf.save_pretrained(tmp_path / "hf")
    for name in sc.TOKENIZER_FILES:
        shutil.copyfile(spm / name, tmp_path / "hf" / name)
    return hf, tmp_path / "hf"


def hf_shapes_batches(tokenizer_dir: Path):
    from qa_core.tokenizer import XLNetTokenizer

    return sample_batches(
        XLNetTokenizer.from_dir(tokenizer_dir), [(1, 16), (2, 64), (3, 200), (2, 37)], seed=3
    )


def test_hf_simple_checkpoint_matches_transformers(tmp_path, spm_dir):
    hf, hf_dir = hf_directory(transformers.XLNetForQuestionAnsweringSimple, tmp_path, spm_dir)
    assert main(["--checkpoint", str(hf_dir), "--out", str(tmp_path / "onnx")]) == 0
    side = sc.Sidecar.load(tmp_path / "onnx")
    assert side.head == "simple" and side.settings == DEFAULTS.as_dict()
    sess = session(tmp_path / "onnx" / "model.onnx", threads=1)
    for batch in hf_shapes_batches(spm_dir):
        start, end = sess.run(None, batch)
        ids, mask, types = feeds_of(batch)
        with torch.no_grad():
            ref = hf(ids, attention_mask=mask.float(), token_type_ids=types)
        real = mask.numpy().astype(bool)  # padding rows attend differently (QAInference's fused path)
        np.testing.assert_allclose(start[real], ref.start_logits.numpy()[real], atol=1e-4)
        np.testing.assert_allclose(end[real], ref.end_logits.numpy()[real], atol=1e-4)


def test_hf_beam_checkpoint_matches_transformers(tmp_path, spm_dir):
    """HF's `*_log_probs` are probabilities laid out end-major; ours are log-probs, start-major."""
    hf, hf_dir = hf_directory(transformers.XLNetForQuestionAnswering, tmp_path, spm_dir)
    assert main(["--checkpoint", str(hf_dir), "--out", str(tmp_path / "onnx")]) == 0
    side = sc.Sidecar.load(tmp_path / "onnx")
    assert side.head == "beam" and (side.serving.start_n_top, side.serving.end_n_top) == (3, 2)
    k1, k2 = 3, 2
    names = list(output_names("beam"))
    sess = session(tmp_path / "onnx" / "model.onnx", threads=1)
    for batch in hf_shapes_batches(spm_dir):
        got = sess.run(names, batch)
        got = [np.exp(got[0]), got[1], np.exp(got[2]), got[3], got[4]]
        ids, mask, types = feeds_of(batch)
        with torch.no_grad():
            ref = hf(
                ids,
                attention_mask=mask.float(),
                token_type_ids=types,
                p_mask=derive_p_mask(ids, mask, types),
                cls_index=(types == 2).long().argmax(dim=1),
            )

        def start_major(x: torch.Tensor) -> np.ndarray:
            return x.reshape(-1, k2, k1).transpose(1, 2).reshape(-1, k1 * k2).numpy()

        expected = [
            ref.start_top_log_probs.numpy(),
            ref.start_top_index.numpy(),
            start_major(ref.end_top_log_probs),
            start_major(ref.end_top_index),
            ref.cls_logits.numpy(),
        ]
        result = compare(names, [expected], [got], 1e-4)
        assert result.passed, (batch["input_ids"].shape, result.problems)


# --- the sidecar ----------------------------------------------------------------------------------------
def test_sidecar_round_trip_and_errors(exports, tmp_path):
    _, out = exports["beam"]
    side = sc.Sidecar.load(out)
    again = sc.Sidecar.from_dict(json.loads((out / sc.SIDECAR_FILE).read_text()))
    assert again == side
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    side.extra["served_by"] = "test"
    side.save(copy)
    assert (
        sc.Sidecar.load(copy).extra == {"served_by": "test"} and sc.Sidecar.load(copy).max_batch_size is None
    )

    def broken(**changes) -> str:
        data = {**json.loads((out / sc.SIDECAR_FILE).read_text()), **changes}
        data = {k: v for k, v in data.items() if v is not None}
        (copy / sc.SIDECAR_FILE).write_text(json.dumps(data))
        with pytest.raises(sc.SidecarError) as err:
            sc.Sidecar.load(copy)
        return str(err.value)

    assert "head must be one of" in broken(head="huge")
    assert "outputs for head 'beam'" in broken(outputs=["start_logits", "end_logits"])
    assert "missing required keys ['backend']" in broken(backend=None)
    assert "format_version 2" in broken(format_version=2)
    assert "needs a 'trt' section" in broken(backend="tensorrt")
    assert "no_answer_threshold" in broken(no_answer_threshold=1.5)
    assert "relative path inside" in broken(model_file="../model.onnx")
    assert "max_query_len" in broken(max_query_len=400)
    assert "files that are missing: ['nope.onnx']" in broken(model_file="nope.onnx")
    (copy / sc.SIDECAR_FILE).write_text("{not json")
    with pytest.raises(sc.SidecarError, match="invalid JSON"):
        sc.Sidecar.load(copy)
    (copy / sc.SIDECAR_FILE).unlink()
    with pytest.raises(sc.SidecarError, match="no export.json"):
        sc.Sidecar.load(copy)
    with pytest.raises(sc.SidecarError, match="not an export directory"):
        sc.Sidecar.load(tmp_path / "absent")
    shapes = {"min_shape": [1, 16], "opt_shape": [8, 384], "max_shape": [32, 512]}
    engine = sc.Sidecar.from_dict(
        {**side.to_dict(), "backend": "tensorrt", "model_file": "model.engine", "trt": shapes}
    )
    assert (engine.max_batch_size, engine.max_sequence_length) == (32, 512)
    with pytest.raises(sc.SidecarError, match=r"trt.max_shape must be \[batch, sequence\]"):
        sc.Sidecar.from_dict({**engine.to_dict(), "trt": {**shapes, "max_shape": [32]}})
    # 'tensorrt' (what earlier exporters wrote) still reads, as the one name the server and exporters use
    assert engine.backend == "trt" and engine.to_dict()["backend"] == "trt"
    with pytest.raises(sc.SidecarError, match="backend must be one of"):
        sc.Sidecar.from_dict({**side.to_dict(), "backend": "torch"})


def test_serving_settings_have_one_declaration(exports):
    """export.json keeps its keys in their order, and the server's spec carries the sidecar's settings."""
    from server.answering.model_spec import load_export_spec

    _, out = exports["beam"]
    side = sc.Sidecar.load(out)
    data = json.loads((out / sc.SIDECAR_FILE).read_text())
    assert (
        list(side.to_dict()) == list(data)
        and list(data).index("max_seq_len") == list(data).index("opset") + 1
    )
    spec = load_export_spec(out)
    assert spec.serving == side.serving and spec.public()["max_seq_len"] == side.serving.max_seq_len


def test_sidecar_is_torch_free():
    code = "import sys, qa_core.runtime.sidecar; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# --- command line ---------------------------------------------------------------------------------------
def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m export.onnx: error: "), err
    return err[0]


def test_cli_errors(tmp_path, spm_dir, capsys, exports):
    ckpt, _ = exports["shallow"]
    assert main(["--checkpoint", str(tmp_path / "absent"), "--out", str(tmp_path / "o")]) == 2
    assert "no such directory" in one_line_error(capsys)
    torch.manual_seed(0)
    lm = checkpoint.save(XLNetLMHeadModel(XLNetConfig(vocab_size=2000, **TINY_ARGS)), tmp_path / "lm")
    assert main(["--checkpoint", str(lm), "--out", str(tmp_path / "o")]) == 2
    assert "'lm' model without a QA head; pass --head" in one_line_error(capsys)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["--checkpoint", str(ckpt), "--out", str(a_file / "sub")]) == 2
    assert "cannot write there" in one_line_error(capsys)
    assert main(["--checkpoint", str(ckpt), "--out", str(a_file)]) == 2
    assert "not a directory" in one_line_error(capsys)
    assert main(["--checkpoint", str(ckpt), "--out", str(tmp_path)]) == 2
    assert "refusing to replace it" in one_line_error(capsys)
    assert (
        main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "o"), "--agreement-data", "nope.json"]) == 2
    )
    assert "no such file" in one_line_error(capsys)
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "o"), "--precision", "int4"])
    assert exc.value.code == 2
    assert not (tmp_path / "o").exists()


def test_lm_checkpoint_with_head_warns_loudly(tmp_path, spm_dir, capsys):
    from qa_core.tokenizer import XLNetTokenizer

    torch.manual_seed(0)
    lm = XLNetLMHeadModel(XLNetConfig(vocab_size=2000, **TINY_ARGS))
    ckpt = checkpoint.save(lm, tmp_path / "lm", tokenizer=XLNetTokenizer.from_dir(spm_dir))
    assert (
        main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "o"), "--head", "deep", "--no-optimize"])
        == 0
    )
    err = capsys.readouterr().err
    assert "RANDOMLY INITIALISED" in err and "'lm' checkpoint" in err
    side = sc.Sidecar.load(tmp_path / "o")
    assert side.head == "deep" and side.extra["untrained_head"] is True and side.verification["passed"]
    assert side.portable_model_file == "model.onnx" and not (tmp_path / "o" / "model.portable.onnx").exists()


# --- the pipeline as a library ---------------------------------------------------------------------------
def test_options_check_themselves_before_any_work(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "o"  # never read: the checks come first
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        OnnxExportOptions(checkpoint=ckpt, out=out, threads=0)
    with pytest.raises(FileNotFoundError, match="nope.json: no such file"):
        OnnxExportOptions(checkpoint=ckpt, out=out, agreement_data=tmp_path / "nope.json")
    with pytest.raises(ValueError, match="--precision must be one of"):
        OnnxExportOptions(checkpoint=ckpt, out=out, precision="int4")
    with pytest.raises(ValueError, match="--head must be one of"):
        OnnxExportOptions(checkpoint=ckpt, out=out, head="huge")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not empty and not an export directory"):
        export_onnx(OnnxExportOptions(checkpoint=ckpt, out=tmp_path))
    assert not out.exists()
    # every flag reaches its option
    argv = ["--checkpoint", str(ckpt), "--out", str(out), "--opset", "18", "--precision", "int8"]
    argv += ["--head", "deep", "--tokenizer", "tok", "--no-verify", "--no-optimize", "--per-channel"]
    argv += ["--quantize-heads", "--tolerance", "0.1", "--threads", "3", "--agreement-data", str(SAMPLE_DEV)]
    argv += ["--agreement-max", "7", "--benchmark", "2"]
    assert options_from_args(build_parser().parse_args(argv)) == OnnxExportOptions(
        ckpt, out, 18, "int8", "deep", "tok", False, False, True, True, 0.1, 3, str(SAMPLE_DEV), 7, 2
    )


def test_pipeline_reports_through_callbacks_and_prints_nothing(tmp_path, spm_dir, capsys, caplog):
    """Progress lines reach `report`; warnings are Python warnings by default; stdout and stderr stay empty,
    and onnxruntime's shape inference logs none of its expected "Cannot determine if ..." lines."""
    from qa_core.tokenizer import XLNetTokenizer

    torch.manual_seed(0)
    lm = XLNetLMHeadModel(XLNetConfig(vocab_size=2000, **TINY_ARGS))
    ckpt = checkpoint.save(lm, tmp_path / "lm", tokenizer=XLNetTokenizer.from_dir(spm_dir))
    lines: list[str] = []
    options = OnnxExportOptions(checkpoint=ckpt, out=tmp_path / "o", head="shallow", optimize=False)
    with pytest.warns(UserWarning, match="RANDOMLY INITIALISED"):
        result = export_onnx(options, report=lines.append)
    assert capsys.readouterr() == ("", "")
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("onnxruntime")]
    assert lines[0].startswith(f"python -m export.onnx: {ckpt} (qa:shallow, d_model 32, 2 layers) -> ")
    assert any(line.startswith("verify fp32 graph (onnxruntime) vs PyTorch") for line in lines)
    assert "  -> passed" in lines and lines[-1].startswith(
        f"wrote {tmp_path / 'o'}/: model.onnx, export.json"
    )
    assert result.out == tmp_path / "o" and result.model_path == tmp_path / "o" / "model.onnx"
    assert result.portable_path == result.model_path and result.verification["passed"] is True
    assert result.sidecar == sc.Sidecar.load(tmp_path / "o")


def test_failed_verification_exits_1_and_writes_nothing(tmp_path, exports, capsys):
    ckpt, _ = exports["simple"]
    out = tmp_path / "o"
    assert main(["--checkpoint", str(ckpt), "--out", str(out), "--tolerance", "1e-12", "--no-optimize"]) == 1
    err = capsys.readouterr().err
    assert "verification failed, nothing written" in err and "> tolerance" in err
    assert not out.exists() and not list(tmp_path.glob(".o.tmp-*"))


def test_module_entry_point_reports_errors_in_one_line(tmp_path):
    proc = run_module("export.onnx", "--checkpoint", tmp_path / "absent", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"python -m export.onnx: error: --checkpoint {tmp_path / 'absent'}: no such directory"
    ]


def test_graph_checker_catches_forbidden_ops_and_trace_constants():
    from onnx import TensorProto, helper, numpy_helper

    from export.onnx.graph import GraphCheckError, check_graph, trace_length_for

    trace = trace_length_for({32, 64, 128})
    assert trace == 29 and trace_length_for({29, 30}) == 37 and trace_length_for({58}) == 31
    shape = numpy_helper.from_array(np.array([2, trace, 8], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="specialised"),
        helper.make_node("EyeLike", ["y"], ["z"], name="eye"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [shape],
    )
    with pytest.raises(GraphCheckError) as err:
        check_graph(helper.make_model(graph), trace)
    assert "'EyeLike': 1" in str(err.value) and "'specialised' has a constant [2, 29, 8]" in str(err.value)
