"""The model pinned against small reference re-implementations of the original XLNet (modeling.py):
relative positions, attention masks, memory, and the GELU.

Each ``_orig_*`` function is a reference in numpy / plain Python: how they are written, and the list
of points with their tests, are in docs/recipe.md ("Points the review found matching").
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from harness.tiny_models import TINY
from train.model import XLNetConfig, XLNetModel, checkpoint
from train.model.layers import activation
from train.model.position import attention_masks, relative_positions

# =====================================================================================================
# Model: modeling.py relative_positional_encoding (clamp_len, bi_data), _create_mask (same_length) and
# the masks of transformer_xl, _cache_mem
# =====================================================================================================


def _orig_relative_positional_encoding(qlen, klen, d_model, clamp_len, attn_type, bi_data, bsz):
    """modeling.py relative_positional_encoding, as [positions, bsz, d_model]. Facts encoded: the
    relative distances run from klen down to -qlen + 1 ("bi") or down to 0 ("uni"); when clamp_len > 0
    they are clipped to [-clamp_len, clamp_len]; distance d is encoded as [sin(d * f), cos(d * f)] with
    ``f_i = 10000 ** (-2i / d_model)``; with bi_data the first bsz // 2 batch rows use these distances
    and the next bsz // 2 rows their negation."""
    distances = np.arange(klen, (-qlen if attn_type == "bi" else -1), -1, dtype=np.float64)
    if clamp_len > 0:
        distances = np.clip(distances, -clamp_len, clamp_len)
    freqs = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)

    def encode(d, rows):
        angles = np.outer(d, freqs)
        table = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)
        return np.repeat(table[:, None, :], rows, axis=1)

    if not bi_data:
        return encode(distances, bsz)
    return np.concatenate([encode(distances, bsz // 2), encode(-distances, bsz // 2)], axis=1)


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
@pytest.mark.parametrize("bi_data", [False, True])
@pytest.mark.parametrize("clamp_len", [-1, 3, 50])
@pytest.mark.parametrize("mlen", [0, 4])
def test_relative_positions_match_the_original(attn_type, bi_data, clamp_len, mlen) -> None:
    qlen, d_model, bsz = 7, 16, 4
    klen = qlen + mlen
    expected = _orig_relative_positional_encoding(qlen, klen, d_model, clamp_len, attn_type, bi_data, bsz)
    got = relative_positions(
        qlen,
        klen,
        d_model,
        attn_type=attn_type,
        bi_data=bi_data,
        clamp_len=clamp_len,
        batch_size=bsz,
        device=torch.device("cpu"),
    )
    got = got.expand(bsz, -1, -1).transpose(0, 1).double().numpy()
    np.testing.assert_allclose(got, expected, atol=2e-6)


def _orig_causal_mask(qlen, mlen, same_length):
    """modeling.py _create_mask: [qlen, mlen + qlen], 1 = may not attend. Query i (whose own key is
    mlen + i) sees the whole memory and the current positions up to itself; with same_length it also
    loses the keys before key i, so that every query sees exactly the mlen + 1 keys ending at itself.
    (The original adds that band to the first qlen key columns, memory included; every key k < i lies
    among them.)"""
    query, key = np.indices((qlen, mlen + qlen))
    return ((key > query + mlen) | (same_length & (key < query))).astype(np.float64)


def _orig_transformer_xl_masks(qlen, mlen, bsz, attn_type, same_length, input_mask, perm_mask):
    """The two attention masks modeling.py transformer_xl builds: (content stream, query stream), each
    [qlen, klen, 1 or bsz, 1] with 1 = may not attend, or (None, None) for attn_type "bi" with neither
    input_mask ([qlen, bsz], 1 = padding) nor perm_mask ([qlen, qlen, bsz], 1 = may not attend).
    Facts encoded: the query-stream mask is the union of the causal mask (``_orig_causal_mask``, "uni"
    only), the padding keys and perm_mask, where padding and perm_mask never touch the memory keys; the
    content-stream mask is the same except that a query always sees its own position."""
    parts = []
    if attn_type == "uni":
        parts.append(_orig_causal_mask(qlen, mlen, same_length)[:, :, None] > 0)
    for data in (None if input_mask is None else input_mask[None], perm_mask):
        if data is not None:  # [queries or 1, qlen, bsz]: memory keys in front stay visible
            parts.append(np.pad(data > 0, ((0, 0), (mlen, 0), (0, 0))))
    if not parts:
        return None, None
    query_stream = functools.reduce(np.logical_or, parts)
    own_key = np.eye(qlen, mlen + qlen, k=mlen, dtype=bool)[:, :, None]
    content_stream = query_stream & ~own_key
    return content_stream[..., None].astype(np.float64), query_stream[..., None].astype(np.float64)


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("mlen", [0, 3, 9])
@pytest.mark.parametrize("data", ["none", "input", "perm", "both"])
def test_attention_masks_match_the_original(attn_type, same_length, mlen, data) -> None:
    qlen, bsz = 6, 2
    klen = qlen + mlen
    rng = np.random.default_rng(mlen)
    input_mask = np.zeros([qlen, bsz])
    input_mask[-2:, 1] = 1  # padding at the end of row 1
    perm = (rng.random([qlen, qlen, bsz]) < 0.4).astype(np.float64)
    im = input_mask if data in ("input", "both") else None
    pm = perm if data in ("perm", "both") else None
    ref_content, ref_query = _orig_transformer_xl_masks(qlen, mlen, bsz, attn_type, same_length, im, pm)
    content, query = attention_masks(
        qlen,
        mlen,
        attention_mask=None if im is None else torch.from_numpy(1 - im.T).long(),
        perm_mask=None if pm is None else torch.from_numpy(pm.transpose(2, 0, 1)).float(),
        attn_type=attn_type,
        same_length=same_length,
        device=torch.device("cpu"),
    )
    if ref_content is None:
        assert content is None and query is None
        return
    for got, ref in ((content, ref_content), (query, ref_query)):
        got = got.expand(bsz, qlen, klen).numpy()  # [B, T, K], True = masked
        ref = np.broadcast_to(ref[..., 0], (qlen, klen, bsz)).transpose(2, 0, 1)  # [B, T, K]
        np.testing.assert_array_equal(got, ref > 0)


def test_same_length_uni_with_memory_matches_transformers(tmp_path: Path) -> None:
    """Model-level oracle for same_length (only used with attn_type='uni', as in the original)."""
    cfg = transformers.XLNetConfig(
        vocab_size=97,
        **TINY,
        ff_activation="gelu",
        attn_type="uni",
        same_length=True,
        mem_len=5,
        reuse_len=4,
    )
    torch.manual_seed(0)
    hf = transformers.XLNetModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    ours = checkpoint.load(tmp_path).model.eval()
    assert ours.config.same_length and ours.config.attn_type == "uni"
    g = torch.Generator().manual_seed(1)
    ids1, ids2 = torch.randint(9, 97, (2, 2, 8), generator=g)
    with torch.no_grad():
        ref1 = hf(ids1, use_mems=True)
        got1 = ours(ids1)
        ref2 = hf(ids2, mems=ref1.mems, use_mems=True)
        got2 = ours(ids2, mems=got1.mems)
    torch.testing.assert_close(got2.last_hidden_state, ref2.last_hidden_state, atol=1e-5, rtol=0)
    # and same_length really changes the result here (the mask differs once there is memory)
    flat = dataclasses.replace(ours.config, same_length=False)
    other = XLNetModel(flat).eval()
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        plain = other(ids2, mems=got1.mems).last_hidden_state
    assert (plain - got2.last_hidden_state).abs().max() > 1e-4


def _orig_cache_mem(curr_out, prev_mem, mem_len, reuse_len=None):
    """modeling.py _cache_mem: no memory at all when mem_len is None or 0; otherwise the old memory (if
    any) followed by the layer input's first reuse_len positions (all of them when reuse_len is None
    or not positive), of which the last mem_len positions are kept."""
    if not mem_len:
        return None
    fresh = curr_out[:reuse_len] if (reuse_len or 0) > 0 else curr_out
    return np.concatenate([m for m in (prev_mem, fresh) if m is not None])[-mem_len:]


@pytest.mark.parametrize(("mem_len", "reuse_len"), [(6, 4), (3, 4), (6, None), (0, 4), (None, None)])
def test_memory_is_cache_mem(mem_len, reuse_len) -> None:
    """Each layer's memory: its input's first reuse_len positions appended to the old memory, the
    last mem_len kept (no memory at all for mem_len None/0, as the original; HF would keep all)."""
    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=50, dropout=0.0)
    config = dataclasses.replace(config, mem_len=mem_len, reuse_len=reuse_len)
    model = XLNetModel(config).eval()
    g = torch.Generator().manual_seed(0)
    ids1, ids2 = torch.randint(9, 50, (2, 2, 10), generator=g)
    with torch.no_grad():
        out1 = model(ids1, output_hidden_states=True)
        out2 = model(ids2, mems=out1.mems, output_hidden_states=True)
    if not mem_len:
        assert out1.mems is None and out2.mems is None
        return
    for layer in range(config.n_layer):
        inputs1 = out1.hidden_states[layer].transpose(0, 1).numpy()  # the layer's input, [T, B, D]
        inputs2 = out2.hidden_states[layer].transpose(0, 1).numpy()
        exp1 = _orig_cache_mem(inputs1, None, mem_len, reuse_len)
        exp2 = _orig_cache_mem(inputs2, exp1, mem_len, reuse_len)
        np.testing.assert_allclose(out1.mems[layer].numpy(), exp1, atol=1e-6)
        np.testing.assert_allclose(out2.mems[layer].numpy(), exp2, atol=1e-6)
        assert not out1.mems[layer].requires_grad


def _orig_gelu(x: np.ndarray) -> np.ndarray:
    """modeling.py gelu is the tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def test_gelu_variants() -> None:
    """KNOWN DEVIATION, pinned: the original's "gelu" is the tanh approximation = our (and HF's)
    "gelu_new"; our default "gelu" is the exact erf form, as HF's "gelu" (max difference ~4.7e-4)."""
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    orig = _orig_gelu(x.numpy())
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()])
    np.testing.assert_allclose(activation("gelu_new")(x).numpy(), orig, atol=1e-12)
    np.testing.assert_allclose(activation("gelu")(x).numpy(), exact, atol=1e-12)
    gap = np.abs(exact - orig).max()
    assert 4e-4 < gap < 5e-4
    from transformers.activations import ACT2FN

    np.testing.assert_allclose(ACT2FN["gelu"](x).numpy(), exact, atol=1e-12)
    np.testing.assert_allclose(ACT2FN["gelu_new"](x).numpy(), orig, atol=1e-12)
    assert XLNetConfig().ff_activation == "gelu"  # the default is the exact form, not the original's
