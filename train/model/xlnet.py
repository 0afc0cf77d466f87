"""The XLNet backbone: embeddings, relative positions, memory, two streams; and the LM head model."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from train.model import contrib_attention
from train.model.attention import additive_mask, masked_fill_value
from train.model.config import XLNetConfig
from train.model.fused import (
    Attend,
    FusedAttentionWeights,
    FusedInputs,
    fused_attention,
    fused_inputs,
    segment_gain,
)
from train.model.layers import XLNetLayer
from train.model.layout import question_match
from train.model.position import attention_masks, relative_positions, segment_difference


@dataclass
class XLNetModelOutput:
    last_hidden_state: torch.Tensor  # [B, T, D] content stream
    query_hidden_state: torch.Tensor | None = None  # [B, P, D] when target_mapping is given
    mems: list[torch.Tensor] | None = None  # n_layer x [M, B, D]
    hidden_states: list[torch.Tensor] | None = None  # content stream after embeddings and each layer


@dataclass
class XLNetLMOutput:
    logits: torch.Tensor  # [B, P, V] with target_mapping, else [B, T, V]
    mems: list[torch.Tensor] | None = None
    loss: torch.Tensor | None = None
    query_hidden_state: torch.Tensor | None = None


def init_weights(module: nn.Module, std: float) -> None:
    """Normal(0, std) for every weight, zeros for biases, ones for LayerNorm gains (original XLNet)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    for name, param in module.named_parameters(recurse=False):
        if name in ("q", "k", "v", "o", "r", "r_r_bias", "r_s_bias", "r_w_bias", "seg_embed", "mask_emb"):
            nn.init.normal_(param, std=std)


class XLNetModel(nn.Module):
    """Batch-first inputs ([B, T]); memories time-major ([M, B, D]) as HF's, so they interoperate."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.config = config
        self.word_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, config.d_model))
        # Zero at the start, so a checkpoint without it (pretraining, HF) computes exactly as before.
        self.match_emb = nn.Parameter(torch.zeros(config.d_model)) if config.question_match else None
        self.layer = nn.ModuleList([XLNetLayer(config) for _ in range(config.n_layer)])
        self.dropout = nn.Dropout(config.dropout)
        self.apply(lambda m: init_weights(m, config.initializer_range))
        if not config.untie_r:
            self.tie_relative_biases()
        self.position_cache_len: int | None = None
        self.fused_inference = False
        self.segment_gain = 1.0  # of the fused layers' segment columns (train.model.fused.segment_gain)
        # Memory for time: keep each layer's inputs only and run its forward again in backward.
        self.activation_checkpointing = False

    @torch.no_grad()
    def cache_positions(self, max_len: int = 512, fused: bool = False) -> None:
        """Inference speed-up: precompute every layer's projected relative positions once.

        The position term's keys `pos_emb(T) @ W_r` depend only on the length, and the distances of a
        length-T window (T .. -T+1) are the middle 2T rows of the table for `max_len`, so a slice
        replaces a [2T, D] x [D, D] MatMul per layer (~12% of the FLOPs at T = 384). Used in eval
        mode for memory-free inputs up to `max_len` tokens; recompute after changing the weights.
        `fused` also switches such content-only calls to `train.model.fused` (the attention in few
        operations, weights rearranged here once; padding rows' outputs differ, see there).
        """
        cfg = self.config
        if cfg.attn_type != "bi" or cfg.bi_data:
            raise ValueError(
                "position caching needs attn_type='bi' and bi_data=False (the inference setting)"
            )
        if max_len < 1:
            raise ValueError(f"max_len must be positive, got {max_len}")
        device = self.word_embedding.weight.device
        pos = relative_positions(
            max_len,
            max_len,
            cfg.d_model,
            attn_type="bi",
            bi_data=False,
            clamp_len=cfg.clamp_len,
            batch_size=1,
            device=device,
        ).to(self.word_embedding.weight.dtype)
        layers = [layer.rel_attn for layer in cast("Iterable[XLNetLayer]", self.layer)]
        self.segment_gain = segment_gain(layers) if fused else 1.0
        for attn in layers:
            attn.k_r_table = attn._heads(pos, attn.r).contiguous()
            attn.fused = FusedAttentionWeights(attn, attn.k_r_table, self.segment_gain) if fused else None
        self.position_cache_len = max_len
        self.fused_inference = fused

    def clear_position_cache(self) -> None:
        for layer in cast("Iterable[XLNetLayer]", self.layer):
            layer.rel_attn.k_r_table = None
            layer.rel_attn.fused = None
        self.position_cache_len = None
        self.fused_inference = False

    def embed(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Word embeddings, plus `match_emb` on question-matched tokens when the config asks for it."""
        h = self.word_embedding(input_ids)
        if self.match_emb is not None and token_type_ids is not None:
            match = question_match(input_ids, token_type_ids, attention_mask).to(h.dtype)
            h = h + match[..., None] * self.match_emb
        return h

    def _forward_fused(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        output_hidden_states: bool,
    ) -> XLNetModelOutput:
        """Content stream, no memory, cached positions: see `train.model.fused`."""
        contrib = contrib_attention.wanted()
        real_length = input_ids.shape[1]
        if contrib:  # its chunks need a multiple of their count: padded here, cut at the end
            input_ids, attention_mask, token_type_ids = contrib_attention.pad_inputs(
                input_ids, attention_mask, token_type_ids
            )
        h = self.embed(input_ids, token_type_ids, attention_mask)
        batch, length = input_ids.shape
        cfg = self.config
        inputs = fused_inputs(
            token_type_ids,
            attention_mask,
            batch=batch,
            length=length,
            d_head=cfg.d_head,
            scale=cast("XLNetLayer", self.layer[0]).rel_attn.scale,
            segment_gain=self.segment_gain,
            table_len=2 * cast(int, self.position_cache_len),
            mask_value=masked_fill_value(h.dtype),
            dtype=h.dtype,
            device=h.device,
        )
        layers = list(cast("Iterable[XLNetLayer]", self.layer))
        attends: list[Attend | None] = [None] * len(layers)
        if contrib:
            attends = list(self._contrib_attends(layers, inputs))
        hidden: list[torch.Tensor] = []
        for layer, attend in zip(layers, attends, strict=True):
            if output_hidden_states:
                hidden.append(h[:, :real_length])
            h = layer.ff(fused_attention(layer.rel_attn, h, inputs, attend))
        h = h[:, :real_length] if contrib else h
        if output_hidden_states:
            hidden.append(h)
        return XLNetModelOutput(
            last_hidden_state=h, mems=None, hidden_states=hidden if output_hidden_states else None
        )

    def _contrib_attends(self, layers: list[XLNetLayer], inputs: FusedInputs) -> list[Attend]:
        """Each layer's attention on onnxruntime's contrib operator (the exporter's CPU graph)."""
        tables = [cast(FusedAttentionWeights, layer.rel_attn.fused).kr for layer in layers]
        n_head = self.config.n_head
        shared = contrib_attention.contrib_inputs(inputs, n_head, tables[0].shape[-1])
        return [
            functools.partial(
                contrib_attention.attention, table=table, shared=shared, inputs=inputs, n_head=n_head
            )
            for table in tables
        ]

    def tie_relative_biases(self) -> None:
        """untie_r=False: one r_w/r_r/r_s bias shared by all layers (the original's default)."""
        first = self.layer[0].rel_attn
        for layer in self.layer[1:]:
            for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
                setattr(layer.rel_attn, name, getattr(first, name))

    @property
    def keeps_memory(self) -> bool:
        """mem_len 0 or None: no memory is returned (the original's `_cache_mem`; HF instead keeps all)."""
        return bool(self.config.mem_len)

    def _cache(self, h: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        """New memory from a layer's input: the first reuse_len positions, last mem_len kept, no grad."""
        cur = h.transpose(0, 1)
        reuse = self.config.reuse_len
        if reuse is not None and reuse > 0:
            cur = cur[:reuse]
        new = cur if prev is None else torch.cat([prev, cur], dim=0)
        return new[-cast(int, self.config.mem_len) :].detach()  # only called when keeps_memory

    def _run_layer(
        self, layer: nn.Module, h: torch.Tensor, g: torch.Tensor | None, *rest: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One layer, both streams; checkpointed when asked and autograd would record it.

        A checkpointed layer keeps only its inputs for backward and runs its forward again there.
        torch restores the RNG state before that recomputation (preserve_rng_state), so dropout draws
        the same masks and the gradients are the ones without checkpointing. A layer that records
        nothing (frozen, and nothing below it trains) is run plainly: there is nothing to save.
        """
        if self.activation_checkpointing and torch.is_grad_enabled():
            inputs = [t for t in (h, g, *rest) if t is not None]
            params = layer.parameters()
            if any(t.requires_grad for t in inputs) or any(p.requires_grad for p in params):
                out = checkpoint(layer, h, g, *rest, use_reentrant=False, preserve_rng_state=True)
                return cast("tuple[torch.Tensor, torch.Tensor | None]", out)
        return layer(h, g, *rest)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
        use_mems: bool = True,
        output_hidden_states: bool = False,
    ) -> XLNetModelOutput:
        cfg = self.config
        bsz, qlen = input_ids.shape
        use_mems = use_mems and self.keeps_memory
        if (
            self.fused_inference
            and mems is None
            and not use_mems
            and perm_mask is None
            and target_mapping is None
            and not self.training
            # position_cache_len is set whenever fused_inference is
            and (torch.jit.is_tracing() or qlen <= cast(int, self.position_cache_len))
        ):
            return self._forward_fused(input_ids, token_type_ids, attention_mask, output_hidden_states)
        mlen = mems[0].shape[0] if mems is not None else 0
        klen = mlen + qlen
        device = input_ids.device
        mask_h, mask_g = attention_masks(
            qlen,
            mlen,
            attention_mask=attention_mask,
            perm_mask=perm_mask,
            attn_type=cfg.attn_type,
            same_length=cfg.same_length,
            device=device,
        )
        h = self.dropout(self.embed(input_ids, token_type_ids, attention_mask))
        mask_h, mask_g = additive_mask(mask_h, h.dtype), additive_mask(mask_g, h.dtype)
        g = None
        if target_mapping is not None:
            g = self.dropout(self.mask_emb.expand(bsz, target_mapping.shape[1], -1))
        seg_diff = segment_difference(token_type_ids, mlen)
        use_cache = self.position_cache_len is not None and mems is None and not self.training
        if use_cache:  # so position_cache_len is not None
            if not torch.jit.is_tracing() and qlen > cast(int, self.position_cache_len):
                raise ValueError(
                    f"input of {qlen} tokens is longer than the cached positions ({self.position_cache_len}); "
                    "call cache_positions(max_len) with a larger max_len"
                )
            pos_emb = None
        else:
            pos_emb = relative_positions(
                qlen,
                klen,
                cfg.d_model,
                attn_type=cfg.attn_type,
                bi_data=cfg.bi_data,
                clamp_len=cfg.clamp_len,
                batch_size=bsz,
                device=device,
            ).to(h.dtype)
            pos_emb = self.dropout(pos_emb)
        new_mems: list[torch.Tensor] = []
        hidden: list[torch.Tensor] = []
        for i, layer in enumerate(self.layer):
            prev = mems[i] if mems is not None else None
            if use_mems:
                new_mems.append(self._cache(h, prev))
            if output_hidden_states:
                hidden.append(h)
            mem_b = prev.transpose(0, 1).to(h.dtype) if prev is not None else None
            h, g = self._run_layer(layer, h, g, mask_h, mask_g, pos_emb, seg_diff, mem_b, target_mapping)
        if output_hidden_states:
            hidden.append(h)
        return XLNetModelOutput(
            last_hidden_state=self.dropout(h),
            query_hidden_state=self.dropout(g) if g is not None else None,
            mems=new_mems if use_mems else None,
            hidden_states=hidden if output_hidden_states else None,
        )


class XLNetLMHeadModel(nn.Module):
    """Backbone + output layer tied to the word embedding (plus its own bias)."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        if config.question_match:
            raise ValueError("question_match is a fine-tuning feature: pretraining has no question to match")
        self.config = config
        self.transformer = XLNetModel(config)
        self.lm_loss = nn.Linear(config.d_model, config.vocab_size)
        nn.init.zeros_(self.lm_loss.bias)
        self.lm_loss.weight = self.transformer.word_embedding.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
        labels: torch.Tensor | None = None,
        use_mems: bool = True,
    ) -> XLNetLMOutput:
        """With target_mapping, logits come from the query stream (what pretraining predicts)."""
        out = self.transformer(
            input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            mems=mems,
            use_mems=use_mems,
        )
        hidden = out.query_hidden_state if out.query_hidden_state is not None else out.last_hidden_state
        logits = self.lm_loss(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
            )
        return XLNetLMOutput(
            logits=logits, mems=out.mems, loss=loss, query_hidden_state=out.query_hidden_state
        )
