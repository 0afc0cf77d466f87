"""ONNX export at reduced precision: int8 (every MatMul per channel) and fp16 answers agree with PyTorch fp32
on real questions, and the agreement report's margins (the best span against the runner-up) are measured
as the report says. The fp32 export of every head is checked in ``test_export_onnx.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from paths import SAMPLE_DEV, SHARED_DEV_NAME, shared_squad_file

from export.onnx.cli import main
from harness.tiny_models import tiny_qa_checkpoint
from qa_core.runtime import sidecar as sc
from qa_core.runtime.sessions import runner, session
from train.model.inference import output_names

SHARED_DEV = shared_squad_file(SHARED_DEV_NAME)


# --- reduced precision ------------------------------------------------------------------------------------
def test_int8_all_matmuls_per_channel(tmp_path, spm_dir):
    """--quantize-heads quantizes every constant-weight MatMul; per-channel scales exist only for 2-D
    weights in onnxruntime, and every weight is 2-D (the segment term is columns of the one input
    projection), so per-channel quantizes them all too."""
    ckpt = tiny_qa_checkpoint(tmp_path / "ckpt", spm_dir, "deep")
    args = ["--checkpoint", str(ckpt), "--out", str(tmp_path / "q"), "--precision", "int8", "--no-optimize"]
    assert main([*args, "--quantize-heads"]) == 0
    q = sc.Sidecar.load(tmp_path / "q").quantization
    # per layer: in, out, ff1, ff2; the deep head: start end cls plus its two hidden layers
    assert q["quantized"] == q["matmuls_with_constant_weight"] == 4 * 2 + 3 * 2 + 2 and not q["excluded"]
    assert main([*args, "--quantize-heads", "--per-channel"]) == 0
    side = sc.Sidecar.load(tmp_path / "q")
    q = side.quantization
    assert q["per_channel"] and not q["excluded"]
    assert q["quantized"] == q["matmuls_with_constant_weight"] and side.verification["passed"]


def test_int8_attention_quantizes_the_products_of_two_activations(tmp_path, spm_dir):
    """--int8-attention: the backbone's attention products (scores, position term, values) become int8
    too, both operands quantized per call; the heads stay float; the graph still verifies against torch.
    (Measured slower than float attention products on a 2-core AVX-512 EPYC: BENCHMARKS.md, machine R.)"""
    ckpt = tiny_qa_checkpoint(tmp_path / "ckpt", spm_dir, "shallow")
    args = ["--checkpoint", str(ckpt), "--precision", "int8", "--no-optimize"]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--out", str(tmp_path / "attn"), "--int8-attention"]) == 0
    plain, attn = sc.Sidecar.load(tmp_path / "plain"), sc.Sidecar.load(tmp_path / "attn")
    assert attn.quantization["activation_products_quantized"] and attn.verification["passed"]
    assert (
        attn.quantization["quantized"]
        > plain.quantization["quantized"]
        == plain.quantization["matmuls_with_constant_weight"] - len(plain.quantization["excluded"])
    )
    ops = [n.op_type for n in onnx.load(str(tmp_path / "attn" / "model.onnx")).graph.node]
    float_products = [
        n.name for n in onnx.load(str(tmp_path / "attn" / "model.onnx")).graph.node if n.op_type == "MatMul"
    ]
    assert all("/transformer/" not in name for name in float_products)  # only the heads' stay float
    assert ops.count("DynamicQuantizeLinear") > 0


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("head", ["shallow", "beam"])
def test_reduced_precision_agreement(tmp_path, spm_dir, capsys, precision, head):
    data = SHARED_DEV or SAMPLE_DEV  # the shipped sample when ../shared is absent
    # Span logits with real margins (a random model's are near-ties everywhere, so any output would
    # "agree"), and a threshold that answers every question: the answers themselves are compared.
    meta = {"max_seq_len": 128, "doc_stride": 64, "no_answer_threshold": 1.0}
    ckpt = tiny_qa_checkpoint(tmp_path / "ckpt", spm_dir, head, metadata=meta, logit_scale=LOGIT_SCALE)
    out = tmp_path / precision
    args = ["--checkpoint", str(ckpt), "--out", str(out), "--precision", precision]
    assert main([*args, "--agreement-data", str(data), "--agreement-max", "100"]) == 0
    printed = capsys.readouterr().out
    assert "agreement with PyTorch fp32 on 100 questions" in printed and "identical answers" in printed
    side = sc.Sidecar.load(out)
    agree = side.agreement
    assert side.precision == precision and agree["questions"] == 100 and agree["features"] >= 100
    assert agree["reference_answered"] == 100, agree  # every question answered: answers are compared
    assert (
        agree["either_answered"] == 100
        and agree["identical_answers_where_either_answers"] == agree["identical_answers"]
    )
    assert "either model answers 100 of them: identical answers there" in printed
    if head == "beam":
        # Beam search (3 x 2 beams here) keeps a discrete candidate set: a reordering at the beam's edge
        # changes which spans are scored, so some clear answers change too (measured: 73-84% identical).
        assert agree["identical_answers"] >= 0.65, agree
    else:  # every change is at a near-tie of the reference (measured: 88-95% identical answers)
        assert agree["identical_answers"] >= 0.8 and agree["identical_clear_best_span"] == 1.0, agree
    changes = round((1 - agree["identical_best_span"]) * 100)
    assert agree["best_span_changes"] == changes >= agree["best_span_changes_at_near_ties"] >= 0
    assert 0 <= agree["clear_best_span_questions"] <= 100 and 0 <= agree["identical_clear_best_span"] <= 1
    clear_changes = round((1 - agree["identical_clear_best_span"]) * agree["clear_best_span_questions"])
    assert clear_changes == changes - agree["best_span_changes_at_near_ties"]
    assert "best spans: " in printed and "changed" in printed
    limit = (0.05 if precision == "fp16" else 0.5) * LOGIT_SCALE  # logits are LOGIT_SCALE times larger
    assert all(v < limit for v in agree["max_abs_diff"].values()), agree
    # The same comparison fails a candidate that outputs zeros: these answers are not near-ties.
    zeros = _agreement_against_zeros(out, head, data)
    assert zeros["reference_answered"] >= 90 and zeros["identical_answers"] < 0.3, zeros
    assert side.verification["passed"] and side.verification["fp32_graph"]["passed"]
    model = onnx.load(str(out / "model.onnx"))
    assert [o.type.tensor_type.elem_type for o in model.graph.output if o.name.endswith("logits")] == [
        onnx.TensorProto.FLOAT
    ] * len([o for o in model.graph.output if o.name.endswith("logits")])
    if precision == "int8":
        q = side.quantization
        n_heads = {"shallow": 3, "beam": 5}[head]  # the heads' own MatMuls stay float by default
        assert q["matmuls_with_constant_weight"] == 4 * 2 + n_heads and len(q["excluded"]) == n_heads
        assert q["quantized"] == 4 * 2  # every backbone weight: in (q k v seg), out, ff1, ff2 per layer
        assert all("/transformer/" not in name for name in q["excluded"])
        assert "int8: quantized 8 of" in printed and side.portable_model_file is None
    else:
        halves = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
        assert len(halves) > len(model.graph.initializer) // 2 and side.portable_model_file == "model.onnx"
        # The relative positions are precomputed in fp32 and stored projected (cache_positions): no
        # sinusoid of large arguments is evaluated in half precision inside the graph.
        assert not any(n.op_type in ("Sin", "Cos") for n in model.graph.node)


LOGIT_SCALE = 10.0


def _agreement_against_zeros(export_dir: Path, head: str, data: Path) -> dict:
    """export.onnx.agreement's report for the exported graph against a candidate whose outputs are all 0."""
    from export.onnx.agreement import agreement
    from qa_core.tokenizer import XLNetTokenizer

    side = sc.Sidecar.load(export_dir)
    names = output_names(head)
    reference = runner(session(export_dir / side.model_file), names)

    def zeros(feeds):
        return [np.zeros_like(o) for o in reference(feeds)]

    settings = side.serving.model
    tok = XLNetTokenizer.from_dir(export_dir)
    return agreement(str(data), tok, head, names, reference, zeros, settings, max_questions=100)


def test_best_span_margin_skips_candidates_with_the_same_text():
    from export.onnx.agreement import best_span_margin
    from qa_core.squad.decode import NBestEntry, Prediction

    def entry(text: str, score: float) -> NBestEntry:
        return NBestEntry(text, 0, len(text), score, 0.0, 0.0, 0.0, 0, 0, 0)

    def prediction(*entries: NBestEntry) -> Prediction:
        return Prediction("q", "", -1, -1, 0.0, 1.0, 0.0, True, list(entries))

    assert best_span_margin(prediction(entry("a cat", 3.0), entry("a cat", 2.99), entry("cat", 2.5))) == 0.5
    assert best_span_margin(prediction(entry("a cat", 3.0), entry("a cat", 2.0))) == float("inf")
    assert best_span_margin(prediction()) == float("inf")
