"""AdamW parameter groups (no decay on LayerNorm/bias, layer-wise lr decay) and lr schedules."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

NO_DECAY = ("bias", "layer_norm", "LayerNorm", "r_w_bias", "r_r_bias", "r_s_bias", "mask_emb")


def layer_index(name: str, n_layer: int) -> int:
    """Depth of a parameter: 0 = embeddings, 1..n_layer = transformer layers, n_layer + 1 = heads."""
    m = re.search(r"(?:^|\.)layer\.(\d+)\.", name)
    if m:
        return int(m.group(1)) + 1
    if "word_embedding" in name or "mask_emb" in name:
        return 0
    return n_layer + 1


def param_groups(
    model: nn.Module, *, lr: float, weight_decay: float, layer_decay: float = 1.0, n_layer: int | None = None
) -> list[dict]:
    """Groups for AdamW: decoupled weight decay except on LayerNorm/bias; lr * layer_decay^(depth from top).

    With layer_decay < 1 the heads learn at `lr`, layer L at lr * d, ..., embeddings at the lowest rate
    (the XLNet fine-tuning recipe). Frozen parameters (requires_grad False) are left out.
    """
    n_layer = n_layer if n_layer is not None else model.config.n_layer
    groups: dict[tuple[int, bool], dict] = {}
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        depth = layer_index(name, n_layer)
        decay = not any(k in name for k in NO_DECAY) and param.dim() > 1
        key = (depth, decay)
        if key not in groups:
            scale = layer_decay ** (n_layer + 1 - depth)
            groups[key] = {"params": [], "lr": lr * scale, "weight_decay": weight_decay if decay else 0.0}
        groups[key]["params"].append(param)
    for group in groups.values():
        group["initial_lr"] = group["lr"]
    return [groups[k] for k in sorted(groups)]


def make_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.01,
    layer_decay: float = 1.0,
    betas=(0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.AdamW:
    groups = param_groups(model, lr=lr, weight_decay=weight_decay, layer_decay=layer_decay)
    if not groups:
        raise ValueError("no trainable parameters (everything is frozen?)")
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def lr_lambda(total_steps: int, warmup: int, decay: str = "linear", min_ratio: float = 0.0):
    """Linear warmup to the peak, then linear or cosine decay to `min_ratio` of it."""
    if decay not in ("linear", "cosine", "constant"):
        raise ValueError(f"decay must be linear, cosine or constant, got {decay!r}")

    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if decay == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if decay == "linear":
            return min_ratio + (1 - min_ratio) * (1 - progress)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def make_scheduler(optimizer, total_steps: int, warmup: int, decay: str = "linear"):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, warmup, decay))
