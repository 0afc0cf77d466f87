"""Two-stream relative multi-head attention (XLNet), with optional Attention-on-Attention.

Parameters keep the layout of the original/HF checkpoints ([d_model, n_head, d_head]) so weights load
without conversion; the arithmetic is done as batch-first MatMuls, which onnxruntime and TensorRT
optimise far better than the generic Einsums of the reference implementation.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from train.model.config import XLNetConfig
from train.model.position import relative_shift


def masked_fill_value(dtype: torch.dtype) -> float:
    """A large negative score that still fits the dtype (fp16 tops out at 65504)."""
    return -65500.0 if dtype == torch.float16 else -1e30


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Boolean "may not attend" [B|1, T, K] -> a [B|1, 1, T, K] bias added to the scores (0 or very negative).

    Built once per forward and added in every layer: an Add broadcast over the heads is cheap, while
    masked_fill with a mask broadcast over the heads (forward and backward) took ~10% of a pretraining
    step. In fp16 the bias stays far enough below zero to mask, and far enough above fp16's limit that
    bias + score stays finite (a fully masked row then stays uniform, never NaN).
    """
    if mask is None:
        return None
    value = -3.0e4 if dtype == torch.float16 else masked_fill_value(dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, value)[:, None]


class AttentionOnAttention(nn.Module):
    """AoA (Huang et al. 2019): gate the attended vector by the query that asked for it.

    G = sigmoid(Wq_g q + Wv_g att + b_g), I = Wq_i q + Wv_i att + b_i, out = G * I.
    One fused Linear over [q; att] computes both halves.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * d_model, 2 * d_model)

    def forward(self, query: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        gate, info = self.proj(torch.cat([query, attended], dim=-1)).chunk(2, dim=-1)
        return torch.sigmoid(gate) * info


class RelativeAttention(nn.Module):
    """One layer's attention; both streams share every weight."""

    k_r_table: torch.Tensor | None  # a buffer, registered in __init__

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        d, n, dh = config.d_model, config.n_head, config.d_head
        self.n_head, self.d_head, self.d_model = n, dh, d
        self.scale = 1 / (dh**0.5)
        self.q = nn.Parameter(torch.empty(d, n, dh))
        self.k = nn.Parameter(torch.empty(d, n, dh))
        self.v = nn.Parameter(torch.empty(d, n, dh))
        self.o = nn.Parameter(torch.empty(d, n, dh))
        self.r = nn.Parameter(torch.empty(d, n, dh))
        self.r_r_bias = nn.Parameter(torch.empty(n, dh))
        self.r_s_bias = nn.Parameter(torch.empty(n, dh))
        self.r_w_bias = nn.Parameter(torch.empty(n, dh))
        self.seg_embed = nn.Parameter(torch.empty(2, n, dh))
        self.layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.aoa = AttentionOnAttention(d) if config.use_aoa else None
        # Inference cache of the projected relative positions [1, N, 2L, Dh] (see XLNetModel.cache_positions).
        self.register_buffer("k_r_table", None, persistent=False)
        # The inference layout: a train.model.fused.FusedAttentionWeights that XLNetModel.cache_positions sets
        # and fused_attention reads. Typed as the module it is, so that this file does not import the fused
        # formulation that imports it (no import circle).
        self.fused: nn.Module | None = None

    def _heads(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """[B, L, D] -> [B, N, L, Dh]."""
        b, length, _ = x.shape
        return (
            (x @ weight.reshape(self.d_model, -1))
            .reshape(b, length, self.n_head, self.d_head)
            .transpose(1, 2)
        )

    def _core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_r: torch.Tensor,
        seg_diff: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Scores = content + position + segment terms; returns [B, N, L, Dh]."""
        klen = k.shape[2]
        n, dh = self.n_head, self.d_head
        content = (q + self.r_w_bias.reshape(1, n, 1, dh)) @ k.transpose(-1, -2)
        position = relative_shift((q + self.r_r_bias.reshape(1, n, 1, dh)) @ k_r.transpose(-1, -2), klen)
        scores = content + position
        if seg_diff is not None:
            seg = (q + self.r_s_bias.reshape(1, n, 1, dh)) @ self.seg_embed.permute(1, 2, 0)  # [B,N,L,2]
            scores = scores + torch.where(seg_diff[:, None], seg[..., 1:2], seg[..., 0:1])
        scores = scores * self.scale
        if mask is not None:  # additive_mask: [B|1, 1, T, K]
            scores = scores + mask
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return probs @ v

    def _post(self, stream: torch.Tensor, attn_vec: torch.Tensor) -> torch.Tensor:
        """Output projection (+AoA), dropout, residual, post-LayerNorm."""
        b, _, length, _ = attn_vec.shape
        flat = attn_vec.transpose(1, 2).reshape(b, length, self.n_head * self.d_head)
        out = flat @ self.o.reshape(self.d_model, -1).t()
        if self.aoa is not None:
            out = self.aoa(stream, out)
        return self.layer_norm(self.dropout(out) + stream)

    def cached_k_r(self, qlen: int) -> torch.Tensor:
        """Distances qlen .. -qlen+1 are the middle 2*qlen rows of the cached table."""
        table = cast(torch.Tensor, self.k_r_table)  # only called once cache_positions has set it
        half = table.shape[2] // 2
        return table[:, :, half - qlen : half + qlen]

    def forward(
        self,
        h: torch.Tensor,
        g: torch.Tensor | None,
        mask_h: torch.Tensor | None,
        mask_g: torch.Tensor | None,
        pos_emb: torch.Tensor | None,
        seg_diff: torch.Tensor | None,
        mem: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h [B,T,D] content stream, g [B,P,D] query stream, mem [B,M,D], pos_emb [B|1,R,D];
        mask_h / mask_g are score biases [B|1,1,T,M+T] from `additive_mask`."""
        keys_in = h if mem is None else torch.cat([mem, h], dim=1)
        k = self._heads(keys_in, self.k)
        v = self._heads(keys_in, self.v)
        k_r = self.cached_k_r(h.shape[1]) if pos_emb is None else self._heads(pos_emb, self.r)
        out_h = self._post(h, self._core(self._heads(h, self.q), k, v, k_r, seg_diff, mask_h))
        if g is None:
            return out_h, None
        q_g = self._heads(g, self.q)
        if target_mapping is not None:
            tm = target_mapping[:, None].to(q_g.dtype)  # [B,1,P,T]
            vec_g = tm @ self._core(tm.transpose(-1, -2) @ q_g, k, v, k_r, seg_diff, mask_g)
        else:
            vec_g = self._core(q_g, k, v, k_r, seg_diff, mask_g)
        return out_h, self._post(g, vec_g)
