"""The content-stream QA model as a pure function of (input_ids, attention_mask, token_type_ids).

This is what gets exported (ONNX/TensorRT) and what the torch server backend runs, so the two agree
by construction. No query stream, no memory. Outputs are a tuple in `output_names(head)` order:

- simple:           start_logits [B,T], end_logits [B,T]
- shallow / deep:   start_logits [B,T], end_logits [B,T], cls_logits [B]
- beam:             start_top_log_probs [B,k1], start_top_index [B,k1], end_top_log_probs [B,k1*k2],
                    end_top_index [B,k1*k2], cls_logits [B]   (top-k computed inside the graph)

Per-token logits are raw (decoding applies the feature's p_mask); the beam head needs the mask
before its top-k, so it is derived inside the graph from the inputs: a token may be an answer only
if it is a paragraph token (segment 0, not `<sep>`, not padding) or the `<cls>` token.
"""

from __future__ import annotations

import torch
from torch import nn

from qa_core.contract import SEG_ID_CLS, SEG_ID_PARAGRAPH, SEP_ID
from qa_core.heads import head_spec
from train.model.heads import XLNetForQuestionAnswering


def output_names(head: str) -> tuple[str, ...]:
    """The exported graph's outputs for ``head`` (the head registry's)."""
    return head_spec(head).outputs


def derive_p_mask(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
) -> torch.Tensor:
    """1.0 where a token cannot be (part of) an answer, from the XLNet SQuAD layout `P <sep> Q <sep> <cls>`."""
    paragraph = (token_type_ids == SEG_ID_PARAGRAPH) & (input_ids != SEP_ID) & (attention_mask != 0)
    allowed = paragraph | (token_type_ids == SEG_ID_CLS)
    return (~allowed).to(torch.float32)


MAX_POSITIONS = 512


class QAInference(nn.Module):
    """Wraps a QA model; forward(input_ids, attention_mask, token_type_ids) -> tuple of outputs.

    The projected relative positions are precomputed for windows up to `max_positions` tokens
    (`XLNetModel.cache_positions`, ~12% fewer FLOPs; longer inputs are an error), and attention runs
    the fused inference path (`train.model.fused`): the same outputs at every real
    token, padding rows may differ. token_type_ids must be 0..3 (paragraph, question, <cls>, padding).
    `max_positions=None` keeps the training-time path (the reference in tests).
    """

    def __init__(self, model: XLNetForQuestionAnswering, max_positions: int | None = MAX_POSITIONS) -> None:
        super().__init__()
        self.model = model.eval()
        self.head = model.head
        self.names = output_names(model.head)
        self.masks_in_graph = head_spec(model.head).masks_in_graph
        cfg = model.config
        if max_positions and cfg.attn_type == "bi" and not cfg.bi_data:
            model.transformer.cache_positions(max_positions, fused=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor):
        p_mask = derive_p_mask(input_ids, attention_mask, token_type_ids) if self.masks_in_graph else None
        out = self.model(
            input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, p_mask=p_mask
        )
        return tuple(getattr(out, name) for name in self.names)
