"""Position-wise feed-forward and one XLNet layer."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from train.model.attention import RelativeAttention
from train.model.config import XLNetConfig


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of GELU used by the original TF XLNet ("gelu_new" in HF)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def activation(name: str):
    """Activation by config name; "gelu" is the exact erf form, as HF's."""
    table = {"relu": F.relu, "gelu": F.gelu, "gelu_new": gelu_tanh, "mish": F.mish}
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(table)}")
    return table[name]


class FeedForward(nn.Module):
    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.layer_1 = nn.Linear(config.d_model, config.d_inner)
        self.layer_2 = nn.Linear(config.d_inner, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.act = activation(config.ff_activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dropout(self.act(self.layer_1(x)))
        y = self.dropout(self.layer_2(y))
        return self.layer_norm(y + x)


class XLNetLayer(nn.Module):
    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.rel_attn = RelativeAttention(config)
        self.ff = FeedForward(config)

    def forward(self, h, g, mask_h, mask_g, pos_emb, seg_diff, mem=None, target_mapping=None):
        h, g = self.rel_attn(h, g, mask_h, mask_g, pos_emb, seg_diff, mem=mem, target_mapping=target_mapping)
        return self.ff(h), (self.ff(g) if g is not None else None)
