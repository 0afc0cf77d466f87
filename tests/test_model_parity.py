"""Numerical parity with HuggingFace transformers (the oracle): same weights in, same numbers out."""

from __future__ import annotations

import pytest
import torch
import transformers
from paths import SAMPLE_CALIBRATION, SAMPLE_TRAIN

from harness.tiny_models import TINY
from train.finetune import main as finetune_main
from train.model import XLNetConfig, XLNetForQuestionAnswering, checkpoint

TOL = 1e-5
V = 97


def hf_config(**kw) -> transformers.XLNetConfig:
    base = dict(
        vocab_size=V, **TINY, ff_activation="gelu", mem_len=None, reuse_len=None, bi_data=False, clamp_len=-1
    )
    base.update(kw)
    return transformers.XLNetConfig(**base)


def hf_roundtrip(hf_cls, cfg, tmp_path, prepare=None):
    torch.manual_seed(0)
    hf = hf_cls(cfg).eval()
    with torch.no_grad():  # random non-zero biases/LayerNorms so every parameter matters
        for name, p in hf.named_parameters():
            if "bias" in name or "LayerNorm" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        if prepare:
            prepare(hf)
    hf.save_pretrained(tmp_path)
    ours = checkpoint.load(tmp_path).model.eval()
    return hf, ours


def inputs(b=2, t=9, seed=1, pad=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(9, V, (b, t), generator=g)
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, t // 2 :] = 1
    types[:, -1] = 2
    mask = torch.ones(b, t, dtype=torch.long)
    if pad and b > 1:
        mask[1, -3:] = 0
    return ids, types, mask


def close(a, b, what):
    diff = (a - b).abs().max().item()
    assert diff <= TOL, f"{what}: max |diff| {diff:.3g} > {TOL}"


@pytest.mark.parametrize(
    "kw",
    [
        dict(ff_activation="relu"),
        dict(ff_activation="gelu"),
        dict(ff_activation="gelu", bi_data=True, clamp_len=4),
        dict(ff_activation="relu", clamp_len=3),
        dict(attn_type="uni"),
    ],
    ids=["relu", "gelu", "bi_data+clamp", "clamp", "uni"],
)
def test_base_model_hidden_states(kw, tmp_path):
    hf, ours = hf_roundtrip(transformers.XLNetModel, hf_config(**kw), tmp_path)
    ids, types, mask = inputs()
    hf_mask = mask.float()
    if kw.get("attn_type") == "uni":  # HF's in-place mask sum breaks on uni + padding mask + batch > 1
        mask, hf_mask = None, None
    with torch.no_grad():
        ref = hf(ids, token_type_ids=types, attention_mask=hf_mask)
        got = ours(ids, token_type_ids=types, attention_mask=mask)
    close(got.last_hidden_state, ref.last_hidden_state, "content stream")
    # mem_len None: the original keeps no memory; HF returns every layer's whole input instead.
    assert got.mems is None and ref.mems is not None


def same_biases(hf) -> None:
    """Every layer's relative-attention biases set to the first layer's (what untie_r=False means)."""
    first = hf.layer[0].rel_attn
    for layer in hf.layer[1:]:
        for n in ("r_w_bias", "r_r_bias", "r_s_bias"):
            getattr(layer.rel_attn, n).copy_(getattr(first, n))


@pytest.mark.parametrize("tied", [True, False], ids=["equal-biases-tie", "distinct-biases-stay-untied"])
def test_untie_r_false_loads_tied_only_when_the_biases_are_equal(tmp_path, tied: bool):
    """A file saved with untie_r=False but per-layer values loads tied when every layer's biases are
    equal, and keeps them per layer otherwise; either way it computes what transformers does."""
    cfg = hf_config()
    cfg.untie_r = False
    hf, ours = hf_roundtrip(transformers.XLNetModel, cfg, tmp_path, prepare=same_biases if tied else None)
    assert ours.config.untie_r is (not tied)
    if tied:
        assert ours.layer[1].rel_attn.r_w_bias is ours.layer[0].rel_attn.r_w_bias
    ids, types, mask = inputs()
    with torch.no_grad():
        close(
            ours(ids, types, mask).last_hidden_state,
            hf(ids, token_type_ids=types, attention_mask=mask.float())[0],
            "h",
        )


@pytest.mark.parametrize("bi_data", [False, True])
def test_mems_across_two_segments(bi_data, tmp_path):
    hf, ours = hf_roundtrip(
        transformers.XLNetModel, hf_config(mem_len=6, reuse_len=5, bi_data=bi_data), tmp_path
    )
    ids1, types1, _ = inputs(seed=1)
    ids2, types2, mask2 = inputs(seed=2)
    with torch.no_grad():
        ref1 = hf(ids1, token_type_ids=types1, use_mems=True)
        got1 = ours(ids1, token_type_ids=types1)
        ref2 = hf(ids2, token_type_ids=types2, attention_mask=mask2.float(), mems=ref1.mems, use_mems=True)
        got2 = ours(ids2, token_type_ids=types2, attention_mask=mask2, mems=got1.mems)
    assert got1.mems[0].shape == (5, 2, 32)
    for a, b in zip(got1.mems, ref1.mems, strict=True):
        close(a, b, "segment 1 mems")
    close(got2.last_hidden_state, ref2.last_hidden_state, "segment 2 content stream")
    for a, b in zip(got2.mems, ref2.mems, strict=True):
        close(a, b, "segment 2 mems")
    assert got2.mems[0].shape == (6, 2, 32)


def perm_inputs(b=2, t=8, p=3, seed=3):
    g = torch.Generator().manual_seed(seed)
    perm = (torch.rand(b, t, t, generator=g) > 0.6).float()
    tm = torch.zeros(b, p, t)
    for i in range(b):
        for j, pos in enumerate(torch.randperm(t, generator=g)[:p]):
            tm[i, j, pos] = 1.0
    tm[1, -1] = 0.0  # a padding row
    return perm, tm


@pytest.mark.parametrize("with_mems", [False, True])
def test_two_stream_and_lm_logits(with_mems, tmp_path):
    hf, ours = hf_roundtrip(
        transformers.XLNetLMHeadModel, hf_config(mem_len=4, reuse_len=3, ff_activation="relu"), tmp_path
    )
    ids, types, mask = inputs(t=8)
    perm, tm = perm_inputs()
    kw_hf, kw_ours = {}, {}
    if with_mems:
        with torch.no_grad():
            kw_hf["mems"] = hf(ids, token_type_ids=types, use_mems=True).mems
            kw_ours["mems"] = ours(ids, token_type_ids=types).mems
    with torch.no_grad():
        ref = hf(
            ids,
            token_type_ids=types,
            attention_mask=mask.float(),
            perm_mask=perm,
            target_mapping=tm,
            output_hidden_states=True,
            use_mems=True,
            **kw_hf,
        )
        got = ours(
            ids, token_type_ids=types, attention_mask=mask, perm_mask=perm, target_mapping=tm, **kw_ours
        )
        got_base = ours.transformer(
            ids, token_type_ids=types, attention_mask=mask, perm_mask=perm, target_mapping=tm, **kw_ours
        )
    close(got.logits, ref.logits, "LM logits (query stream)")
    assert got.logits.shape == (2, 3, V)
    close(got_base.query_hidden_state, ref.hidden_states[-1], "query stream")
    close(got_base.last_hidden_state, ref.hidden_states[-2], "content stream")
    for a, b in zip(got.mems, ref.mems, strict=True):
        close(a, b, "mems")


def test_lm_logits_without_target_mapping(tmp_path):
    hf, ours = hf_roundtrip(transformers.XLNetLMHeadModel, hf_config(), tmp_path)
    ids, types, mask = inputs()
    with torch.no_grad():
        close(
            ours(ids, types, mask).logits,
            hf(ids, token_type_ids=types, attention_mask=mask.float()).logits,
            "logits",
        )


def test_qa_simple_start_end(tmp_path):
    hf, ours = hf_roundtrip(transformers.XLNetForQuestionAnsweringSimple, hf_config(), tmp_path)
    assert isinstance(ours, XLNetForQuestionAnswering) and ours.head == "simple"
    ids, types, mask = inputs()
    with torch.no_grad():
        ref = hf(ids, token_type_ids=types, attention_mask=mask.float())
        got = ours(ids, token_type_ids=types, attention_mask=mask)
    close(got.start_logits, ref.start_logits, "start")
    close(got.end_logits, ref.end_logits, "end")


def test_qa_beam_head_inference_and_loss(tmp_path):
    hf, ours = hf_roundtrip(transformers.XLNetForQuestionAnswering, hf_config(), tmp_path)
    assert ours.head == "beam"
    ids, types, _ = inputs(pad=False)
    p_mask = (types != 0).float()
    p_mask[:, -1] = 0.0
    k1, k2 = 3, 2
    with torch.no_grad():
        ref = hf(ids, token_type_ids=types, p_mask=p_mask)
        got = ours(ids, token_type_ids=types, p_mask=p_mask)
    # HF's "*_log_probs" are softmax probabilities laid out end-major; ours are log-probs, start-major.
    close(got.start_top_log_probs.exp(), ref.start_top_log_probs, "start top probs")
    assert torch.equal(got.start_top_index, ref.start_top_index)
    ref_end = ref.end_top_log_probs.reshape(-1, k2, k1).transpose(1, 2).reshape(-1, k1 * k2)
    ref_end_idx = ref.end_top_index.reshape(-1, k2, k1).transpose(1, 2).reshape(-1, k1 * k2)
    close(got.end_top_log_probs.exp(), ref_end, "end top probs")
    assert torch.equal(got.end_top_index, ref_end_idx)
    close(got.cls_logits, ref.cls_logits, "cls logits")
    starts, ends = torch.tensor([1, 2]), torch.tensor([3, 2])
    impossible = torch.tensor([0.0, 1.0])
    cls_index = torch.full((2,), ids.shape[1] - 1)
    with torch.no_grad():
        ref_loss = hf(
            ids,
            token_type_ids=types,
            start_positions=starts,
            end_positions=ends,
            cls_index=cls_index,
            is_impossible=impossible,
        ).loss
        # HF's answer class reads the gold start's state in training: our "gold_start" option.
        hf_style = checkpoint.load(tmp_path, config_overrides={"answer_class_input": "gold_start"}).model
        labels = dict(start_positions=starts, end_positions=ends, is_impossible=impossible)
        got_loss = hf_style(ids, token_type_ids=types, **labels).loss
        original_loss = ours(ids, token_type_ids=types, **labels).loss
    close(got_loss, ref_loss, "beam loss (gold_start option)")
    assert abs(original_loss - ref_loss) > 1e-4  # the default reads the softmax-weighted state


@pytest.mark.parametrize(
    "hf_cls",
    [
        transformers.XLNetLMHeadModel,
        transformers.XLNetForQuestionAnsweringSimple,
        transformers.XLNetForQuestionAnswering,
        transformers.XLNetModel,
    ],
)
def test_our_save_loads_in_transformers(hf_cls, tmp_path):
    kind = {
        "XLNetLMHeadModel": "lm",
        "XLNetForQuestionAnsweringSimple": "qa:simple",
        "XLNetForQuestionAnswering": "qa:beam",
        "XLNetModel": "base",
    }[hf_cls.__name__]
    torch.manual_seed(5)
    config = XLNetConfig.preset("tiny", vocab_size=V, dropout=0.0, start_n_top=3, end_n_top=2)
    ours = checkpoint.build_model(config, kind).eval()
    checkpoint.save(ours, tmp_path / "ckpt")
    hf, info = hf_cls.from_pretrained(tmp_path / "ckpt", output_loading_info=True)
    hf.eval()
    # HF re-initialises silently what it does not find: every key must be found, none left over.
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours_state = ours.state_dict()
    for name, value in hf.state_dict().items():  # every HF tensor is ours, bit for bit
        assert torch.equal(value, ours_state[name]), name
    same_outputs(ours, hf, kind)
    again = checkpoint.load(tmp_path / "ckpt")
    assert again.kind == kind


def same_outputs(ours, hf, kind: str) -> float:
    """Our model and HF's give the same outputs on a padded batch; returns the largest |Δ|."""
    ids, types, mask = inputs()
    with torch.no_grad():
        ref = hf(ids, token_type_ids=types, attention_mask=mask.float())
        got = ours(ids, token_type_ids=types, attention_mask=mask)
    if kind == "lm":
        pairs = [(got.logits, ref.logits, "logits")]
    elif kind == "qa:simple":
        pairs = [(got.start_logits, ref.start_logits, "start"), (got.end_logits, ref.end_logits, "end")]
    elif kind == "qa:beam":
        # HF's beam head returns softmax probabilities under the name *_log_probs, and flattens the
        # end beams end-major ([k2, k1]); ours returns log-probabilities flattened start-major
        # ([k1, k2]), as the original XLNet's TF head does.
        k1, k2 = ours.config.start_n_top, ours.config.end_n_top

        def start_major(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(-1, k2, k1).transpose(1, 2).reshape(-1, k1 * k2)

        assert torch.equal(got.start_top_index, ref.start_top_index)
        assert torch.equal(got.end_top_index, start_major(ref.end_top_index))
        pairs = [
            (got.cls_logits, ref.cls_logits, "cls"),
            (got.start_top_log_probs.exp(), ref.start_top_log_probs, "start_top_log_probs"),
            (got.end_top_log_probs.exp(), start_major(ref.end_top_log_probs), "end_top_log_probs"),
        ]
    else:
        pairs = [(got.last_hidden_state, ref.last_hidden_state, "h")]
    for a, b, what in pairs:
        close(a, b, what)
    return max((a - b).abs().max().item() for a, b, _ in pairs)


@pytest.mark.parametrize(
    ("hf_cls", "head"),
    [
        (transformers.XLNetForQuestionAnsweringSimple, "simple"),
        (transformers.XLNetForQuestionAnswering, "beam"),
    ],
)
def test_fine_tuning_round_trips_through_transformers(hf_cls, head, xlnet_tok, tmp_path):
    """An HF QA directory loads in ours with HF's outputs; `python -m train.finetune --init` of it moves
    the weights, and what it writes loads in the same HF class with our outputs."""
    published = tmp_path / "hf"
    hf, ours = hf_roundtrip(hf_cls, hf_config(vocab_size=xlnet_tok.vocab_size), published)
    xlnet_tok.save(published)
    assert ours.head == head
    there = same_outputs(ours, hf, f"qa:{head}")
    out = tmp_path / "ft"
    windows = ["--max-seq-len", "64", "--doc-stride", "32", "--max-query-len", "16", "--batch-size", "4"]
    run = ["--steps", "2", "--lr", "1e-3", "--warmup", "0", "--answerability", "cls"]
    data = [
        "--train-file",
        str(SAMPLE_TRAIN),
        "--dev-file",
        str(SAMPLE_CALIBRATION),
        "--max-dev-examples",
        "8",
    ]
    argv = ["--init", str(published), "--head", head, *data, *windows, *run, "--out", str(out)]
    assert finetune_main(argv) == 0
    tuned = checkpoint.load(out)
    assert tuned.kind == f"qa:{head}"
    start = ours.state_dict()
    unmoved = [k for k, v in tuned.model.state_dict().items() if torch.equal(v, start[k])]
    # mask_emb feeds the query stream, which QA never reads; a bias added to every position's logit
    # before a softmax over positions gets no gradient
    assert [k for k in unmoved if k.startswith("transformer.")] == ["transformer.mask_emb"], unmoved
    assert all(k.endswith(".bias") for k in unmoved if not k.startswith("transformer.")), unmoved
    back, info = hf_cls.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # every weight found, none re-initialised
    back_again = same_outputs(tuned.model.eval(), back.eval(), f"qa:{head}")
    print(f"{head}: max |Δ| HF -> ours {there:.2e}, fine-tuned ours -> HF {back_again:.2e}")


def test_legacy_hf_directory_with_pytorch_model_bin(tmp_path):
    """Old HF checkpoints: pytorch_model.bin (read with weights_only=True) and `n_token` in config.json."""
    import json

    torch.manual_seed(0)
    hf = transformers.XLNetLMHeadModel(hf_config()).eval()
    hf.save_pretrained(tmp_path / "new")
    cfg = json.loads((tmp_path / "new" / "config.json").read_text())
    cfg["n_token"] = cfg.pop("vocab_size")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text(json.dumps(cfg))
    torch.save(hf.state_dict(), legacy / "pytorch_model.bin")
    loaded = checkpoint.load(legacy)
    assert loaded.kind == "lm" and loaded.config.vocab_size == V
    ids, types, mask = inputs()
    with torch.no_grad():
        close(
            loaded.model(ids, types, mask).logits,
            hf(ids, token_type_ids=types, attention_mask=mask.float()).logits,
            "logits",
        )


def test_unsafe_pickle_is_refused(tmp_path):
    import pickle

    (tmp_path / "config.json").write_text(
        '{"model_type": "xlnet", "vocab_size": 10, "d_model": 8, "n_layer": 1, "n_head": 2, "d_inner": 16}'
    )

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(tmp_path / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"x": Evil()}, fh)
    with pytest.raises(checkpoint.CheckpointError, match="weights_only"):
        checkpoint.load(tmp_path)


def test_clear_errors_for_non_checkpoints(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="not a directory"):
        checkpoint.load(tmp_path / "missing")
    with pytest.raises(checkpoint.CheckpointError, match="no config.json"):
        checkpoint.load(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ValueError, match="not an XLNet config"):
        checkpoint.load(tmp_path)
