"""Model options beyond the original (mish, Attention-on-Attention) and export-friendliness."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from train.model import XLNetConfig, XLNetForQuestionAnswering, XLNetLMHeadModel, XLNetModel


def tiny(**kw) -> XLNetConfig:
    return XLNetConfig.preset("tiny", vocab_size=50, dropout=0.0, **kw)


def onnx_bytes(module: torch.nn.Module, args: tuple) -> bytes:
    """``module`` exported as the product exports (TorchScript, opset 17), batch and sequence dynamic."""
    names = ["input_ids", "attention_mask", "token_type_ids"]
    buf = io.BytesIO()
    torch.onnx.export(
        module,
        args,
        buf,
        input_names=names,
        dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
        opset_version=17,
        dynamo=False,
    )
    return buf.getvalue()


def batch(b=2, t=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(9, 50, (b, t), generator=g)
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, t // 2 :] = 1
    types[:, -1] = 2
    return ids, types, torch.ones(b, t, dtype=torch.long)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_new", "mish"])
@pytest.mark.parametrize("aoa", [False, True])
def test_shapes_and_gradients_flow(act, aoa):
    torch.manual_seed(0)
    model = XLNetLMHeadModel(tiny(ff_activation=act, use_aoa=aoa))
    ids, types, mask = batch()
    perm = (torch.rand(2, 10, 10) > 0.5).float()
    tm = torch.zeros(2, 3, 10)
    tm[:, 0, 1] = tm[:, 1, 4] = tm[:, 2, 7] = 1
    out = model(ids, token_type_ids=types, attention_mask=mask, perm_mask=perm, target_mapping=tm)
    assert out.logits.shape == (2, 3, 50)
    out.logits.logsumexp(-1).sum().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not no_grad, f"parameters without finite gradient: {no_grad}"
    if aoa:
        assert model.transformer.layer[0].rel_attn.aoa.proj.weight.grad.abs().sum() > 0


def test_activations_differ():
    ids, types, mask = batch()
    outs = {}
    for act in ("relu", "gelu", "mish"):
        torch.manual_seed(0)
        outs[act] = XLNetModel(tiny(ff_activation=act)).eval()(ids, types, mask).last_hidden_state
    assert not torch.allclose(outs["relu"], outs["mish"])
    assert not torch.allclose(outs["gelu"], outs["mish"])


def test_aoa_off_is_exactly_the_plain_model(tmp_path):
    """Without --aoa the model is HF's XLNet (same weights in, same numbers out); with it, AoA adds only
    its own parameters and changes the outputs."""
    import transformers

    from train.model import checkpoint

    torch.manual_seed(0)
    plain = XLNetModel(tiny()).eval()
    torch.manual_seed(0)
    with_aoa = XLNetModel(tiny(use_aoa=True)).eval()
    # Same backbone weights; AoA adds only its own parameters.
    missing, unexpected = with_aoa.load_state_dict(plain.state_dict(), strict=False)
    assert all(".aoa." in k for k in missing) and not unexpected
    assert not any(".aoa." in n for n, _ in plain.named_parameters())
    ids, types, mask = batch()
    checkpoint.save(plain, tmp_path / "plain")
    hf = transformers.XLNetModel.from_pretrained(tmp_path / "plain").eval()
    with torch.no_grad():
        want = hf(ids, token_type_ids=types, attention_mask=mask.float()).last_hidden_state
        got = plain(ids, types, mask).last_hidden_state
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert not torch.allclose(
        with_aoa(ids, types, mask).last_hidden_state, plain(ids, types, mask).last_hidden_state
    )


def test_bi_data_needs_even_batch():
    model = XLNetModel(tiny(bi_data=True)).eval()
    ids, types, mask = batch(b=3)
    with pytest.raises(ValueError, match="even batch"):
        model(ids, types, mask)


@pytest.mark.parametrize("head", ["simple", "shallow", "deep", "beam"])
def test_content_stream_exports_without_eye_or_onehot(head):
    """The QA graph keeps dynamic axes and contains no EyeLike/OneHot (TensorRT rejects them)."""
    torch.manual_seed(0)
    model = XLNetForQuestionAnswering(tiny(), head=head).eval()
    ids, types, mask = batch(t=12)

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
            if head == "beam":
                return (
                    o.start_top_log_probs,
                    o.start_top_index,
                    o.end_top_log_probs,
                    o.end_top_index,
                    o.cls_logits,
                )
            return o.start_logits, o.end_logits

    exported = onnx_bytes(Wrapper(model), (ids, mask, types))
    graph = onnx.load_from_string(exported).graph
    ops = {n.op_type for n in graph.node}
    assert not ops & {"EyeLike", "OneHot", "Einsum"}, ops
    sess = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
    for b, t in ((1, 7), (3, 20)):
        ids, types, mask = batch(b=b, t=t, seed=b)
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
        got = sess.run(None, feeds)
        with torch.no_grad():
            ref = Wrapper(model)(ids, mask, types)
        for g_, r_ in zip(got, ref, strict=True):
            np.testing.assert_allclose(g_, r_.numpy(), atol=1e-4)


@pytest.mark.parametrize("t", [1, 2, 3, 7, 8, 9, 50])
def test_position_scores_by_index_arithmetic_equal_the_reshape_shift(t):
    """Each query chunk's scores read flat from its product equal Transformer-XL's pad/reshape shift of
    the full [T, 2T] product, for any chunking and any window of a longer table."""
    from train.model.fused import FusedInputs, position_chunks, position_scores
    from train.model.position import relative_shift

    half = 60  # the table holds distances 60 .. -59; the window's T .. -T+1 are its middle 2T columns
    g = torch.Generator().manual_seed(t)
    q = torch.randn(2, 3, t, 8, generator=g)
    table = torch.randn(1, 3, 2 * half, 8, generator=g)
    full = relative_shift(q @ table[:, :, half - t : half + t].transpose(-1, -2), t)
    q = torch.cat([q, torch.randn(2, 3, t, 5, generator=g)], -1)  # columns the position term does not read
    for chunks in (1, 2, 4, 5):
        plan = position_chunks(t, 2 * half, chunks)
        inputs = FusedInputs(2, t, torch.empty(0), torch.empty(0), plan, half - t)
        got = position_scores(q, table, inputs, 3)
        torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_fused_weights_are_buffers_built_once_and_cleared():
    """The inference layout is derived from the parameters (nothing new is saved or trained) and goes
    with the position cache."""
    from qa_core.contract import fused_head_width
    from train.model.fused import FusedAttentionWeights
    from train.model.inference import QAInference

    model = XLNetForQuestionAnswering(tiny(), head="shallow").eval()
    keys = set(model.state_dict())
    n_params = sum(p.numel() for p in model.parameters())
    QAInference(model)
    assert set(model.state_dict()) == keys
    assert sum(p.numel() for p in model.parameters()) == n_params
    attn = model.transformer.layer[0].rel_attn
    assert isinstance(attn.fused, FusedAttentionWeights)
    assert fused_head_width(attn.d_head) % 8 == 0 and fused_head_width(64) == 72
    assert attn.fused.kr.shape[-1] == attn.d_head + 1  # the projected positions and the position bias
    model.transformer.clear_position_cache()
    assert attn.fused is None and not model.transformer.fused_inference


def test_fused_graph_reads_shapes_once_per_forward(tmp_path):
    """Every layer of the exported fused graph has the same few nodes, and none of them reads a shape:
    one more layer adds no Shape node and at most 60 nodes (measured 56.5 with 4 position chunks; the
    previous formulation 161, 7 of them Shape), counted in the graph onnxruntime runs (its extended
    level, the exporter's: merges the layers' identical shape values, fuses a transpose into its MatMul)."""
    from qa_core.runtime.sessions import session
    from train.model.inference import QAInference

    def ops(n_layer: int) -> dict[str, int]:
        torch.manual_seed(0)
        model = XLNetForQuestionAnswering(tiny(n_layer=n_layer), head="shallow").eval()
        ids, types, mask = batch(b=2, t=12)
        raw, ran = tmp_path / f"{n_layer}.onnx", tmp_path / f"{n_layer}.ort.onnx"
        raw.write_bytes(onnx_bytes(QAInference(model), (ids, mask, types)))
        session(raw, threads=1, level="extended", optimized_path=ran)
        counts: dict[str, int] = {}
        for node in onnx.load(str(ran)).graph.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return counts

    one, three = ops(1), ops(3)
    per_layer = (sum(three.values()) - sum(one.values())) / 2
    assert three.get("Shape", 0) == one.get("Shape", 0), (one, three)
    assert per_layer <= 60, (per_layer, one, three)


@pytest.mark.parametrize("head", ["simple", "shallow", "deep", "beam"])
@pytest.mark.parametrize("aoa", [False, True])
def test_fused_inference_matches_the_reference_at_real_positions(head, aoa):
    """QAInference folds segments and padding into the content MatMul: same outputs at real tokens."""
    import copy

    from train.model.inference import QAInference

    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=500, dropout=0.0, use_aoa=aoa)
    model = XLNetForQuestionAnswering(config, head=head).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger weights than the init: differences would show
            p.normal_(0, 0.3)
    reference = QAInference(copy.deepcopy(model), max_positions=None)
    fused = QAInference(model)
    assert model.transformer.fused_inference and not reference.model.transformer.fused_inference
    b, t = 3, 50
    ids = torch.randint(9, 500, (b, t), generator=torch.Generator().manual_seed(1))
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, 30:45], types[:, 45], types[:, 46:] = 1, 2, 3
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 46:] = 0
    mask[2, 40:], types[2, 40:] = 0, 3
    with torch.no_grad():
        want, got = reference(ids, mask, types), fused(ids, mask, types)
    for name, w, g_ in zip(reference.names, want, got, strict=True):
        if name.endswith("_index"):
            assert torch.equal(w, g_), name
        elif w.dim() == 2 and w.shape[1] == t:  # per-token logits: padding rows may differ
            torch.testing.assert_close(g_[mask.bool()], w[mask.bool()], atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(g_, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("clamp_len", [-1, 5])
def test_cached_positions_give_exactly_the_same_outputs(clamp_len):
    torch.manual_seed(0)
    model = XLNetForQuestionAnswering(tiny(clamp_len=clamp_len), head="shallow").eval()
    outs = {}
    for t in (7, 33):
        ids, types, mask = batch(t=t, seed=t)
        mask[1, -2:] = 0
        with torch.no_grad():
            outs[t] = model(ids, token_type_ids=types, attention_mask=mask).start_logits
    model.transformer.cache_positions(40)
    for t in (7, 33):
        ids, types, mask = batch(t=t, seed=t)
        mask[1, -2:] = 0
        with torch.no_grad():
            assert torch.equal(model(ids, token_type_ids=types, attention_mask=mask).start_logits, outs[t])
    with pytest.raises(ValueError, match="longer than the cached positions"):
        model(*batch(t=41)[:1])
    model.train()  # training never uses the cache (dropout on positions, weights change)
    assert model(*batch(t=41)[:1]).start_logits.shape == (2, 41)
    with pytest.raises(ValueError, match="bi_data=False"):
        XLNetModel(tiny(bi_data=True)).cache_positions(16)
