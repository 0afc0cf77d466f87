"""The optimisation recipe of the original XLNet (`model_utils.get_train_op`), shared by pretraining
and fine-tuning: parameter groups, Adam as TensorFlow computes it, global-norm clipping, layer-wise
decay of the clipped gradients, and the warmup + polynomial (linear) decay schedule.

One optimizer step is `optimizer_step`: clip all gradients by their global norm, multiply each
group's gradients by its `grad_scale` (layer-wise decay), let Adam update, advance the schedule.
The order is the original's; `docs/recipe.md` lists each point with the original file it follows.
`MicroBatchClipping` clips per micro-batch instead, as the original does per TPU core.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from train.model.config import XLNetConfig

OPTIMIZERS = ("xlnet", "adamw")
LAYER_DECAY_MODES = ("gradients", "learning-rate")
DECAYS = ("linear", "cosine", "constant")

# No weight decay on names matching these (the original's AdamWeightDecayOptimizer and HF scripts) ...
NO_DECAY_PATTERN = re.compile(r"LayerNorm|layer_norm|bias")
# ... except, in the original only, the relative-attention biases (`include_in_weight_decay`).
FORCE_DECAY_PATTERN = re.compile(r"r_s_bias|r_r_bias|r_w_bias")
# Parameters of transformer layer l. The original keeps r_w/r_r/r_s biases and seg_embed as
# [n_layer, ...] tensors at the transformer level, outside `layer_<l>/`, so layer decay skips them.
ORIGINAL_LAYER_PARAM = re.compile(
    r"(?:^|\.)layer\.(\d+)\.(?!rel_attn\.(?:r_w_bias|r_r_bias|r_s_bias|seg_embed)$)"
)
ANY_LAYER_PARAM = re.compile(r"(?:^|\.)layer\.(\d+)\.")


def uses_weight_decay(name: str, optimizer: str = "xlnet") -> bool:
    """Whether weight decay applies to a parameter of this (HF-style) name: the original's rules for
    `xlnet`, HF scripts' (no bias, no LayerNorm) for `adamw`."""
    forced = optimizer == "xlnet" and bool(FORCE_DECAY_PATTERN.search(name))
    return forced or not NO_DECAY_PATTERN.search(name)


def transformer_layer(name: str) -> int | None:
    """Index l of the transformer layer that owns this parameter in the original's scopes, else None."""
    m = ORIGINAL_LAYER_PARAM.search(name)
    return int(m.group(1)) if m else None


def gradient_scale(name: str, n_layer: int, layer_decay: float) -> float:
    """The original's layer-wise decay: gradients of layer l times decay^(n_layer - 1 - l), others x1."""
    layer = transformer_layer(name)
    return 1.0 if layer is None else layer_decay ** (n_layer - 1 - layer)


def learning_rate_scale(name: str, n_layer: int, layer_decay: float) -> float:
    """The learning-rate variant (as in ELECTRA / many HF scripts): heads x1, layer l x decay^(n_layer - l),
    word embedding and mask_emb x decay^(n_layer + 1). Much stronger than the original under Adam."""
    m = ANY_LAYER_PARAM.search(name)  # every parameter of layer l, its attention biases included
    if m:
        depth = int(m.group(1)) + 1
    elif "word_embedding" in name or "mask_emb" in name:
        depth = 0
    else:
        depth = n_layer + 1
    return layer_decay ** (n_layer + 1 - depth)


def param_groups(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    layer_decay: float = 1.0,
    layer_decay_mode: str = "gradients",
    optimizer: str = "xlnet",
    n_layer: int | None = None,
) -> list[dict]:
    """Groups of trainable parameters with their lr, weight decay and gradient multiplier.

    Each group carries `names` (for logs and tests) and `grad_scale` (read by `optimizer_step`).
    Frozen parameters (requires_grad False) and repeated (tied) parameters are left out.
    """
    if layer_decay_mode not in LAYER_DECAY_MODES:
        raise ValueError(f"layer_decay_mode must be one of {LAYER_DECAY_MODES}, got {layer_decay_mode!r}")
    if not 0.0 < layer_decay <= 1.0:
        raise ValueError(f"layer decay must be in (0, 1], got {layer_decay}")
    n_layer = n_layer if n_layer is not None else cast("XLNetConfig", model.config).n_layer
    groups: dict[tuple[float, float, float], dict] = {}
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        lr_scale, grad_scale = 1.0, 1.0
        if layer_decay_mode == "gradients":
            grad_scale = gradient_scale(name, n_layer, layer_decay)
        else:
            lr_scale = learning_rate_scale(name, n_layer, layer_decay)
        wd = weight_decay if uses_weight_decay(name, optimizer) else 0.0
        key = (lr_scale, grad_scale, wd)
        if key not in groups:
            groups[key] = {
                "params": [],
                "names": [],
                "lr": lr * lr_scale,
                "initial_lr": lr * lr_scale,
                "weight_decay": wd,
                "grad_scale": grad_scale,
            }
        groups[key]["params"].append(param)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups, key=lambda k: (-k[0], -k[1], k[2]))]


class XLNetAdam(torch.optim.Optimizer):
    """Adam exactly as the original XLNet updates: its choice depends on the weight decay.

    - `bias_correction=True` (the original with weight_decay 0, its SQuAD default): TensorFlow's
      `tf.train.AdamOptimizer`, i.e. lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t) and
      p -= lr_t * m / (sqrt(v) + eps). Epsilon is added to the *uncorrected* sqrt(v), unlike
      PyTorch's Adam; the difference is largest in the first steps and for tiny gradients, which
      is where gradient-scaled layer decay acts.
    - `bias_correction=False` (the original with weight_decay > 0): its `AdamWeightDecayOptimizer`,
      p -= lr * (m / (sqrt(v) + eps) + weight_decay * p), no bias correction.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0 (got {lr}, {eps}, {weight_decay})")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                update = m / (v.sqrt() + group["eps"])
                if group["bias_correction"]:
                    t = state["step"]
                    step_size = group["lr"] * math.sqrt(1 - b2**t) / (1 - b1**t)
                else:
                    step_size = group["lr"]
                    if group["weight_decay"]:
                        update.add_(p.float(), alpha=group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-step_size)
        return loss


def make_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.0,
    layer_decay: float = 1.0,
    layer_decay_mode: str = "gradients",
    optimizer: str = "xlnet",
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.Optimizer:
    """`xlnet`: the original's Adam (see XLNetAdam); `adamw`: torch.optim.AdamW (HF scripts' choice)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    groups = param_groups(
        model,
        lr=lr,
        weight_decay=weight_decay,
        layer_decay=layer_decay,
        layer_decay_mode=layer_decay_mode,
        optimizer=optimizer,
    )
    if not groups:
        raise ValueError("no trainable parameters (everything is frozen?)")
    if optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    return XLNetAdam(groups, lr=lr, betas=betas, eps=eps, bias_correction=weight_decay == 0)


@torch.no_grad()
def clip_by_global_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> float:
    """Scale all gradients by max_norm / max(norm, max_norm), as `tf.clip_by_global_norm`; return the norm.

    (torch's clip_grad_norm_ divides by norm + 1e-6 instead: a slightly different scale.)
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()
    if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
        torch._foreach_mul_(grads, max_norm / norm)
    return norm


@torch.no_grad()
def scale_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Multiply each group's gradients by its `grad_scale` (the original's layer-wise decay)."""
    for group in optimizer.param_groups:
        scale = group.get("grad_scale", 1.0)
        if scale == 1.0:
            continue
        grads = [p.grad for p in group["params"] if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, scale)


class MicroBatchClipping:
    """Clip each micro-batch's gradient on its own, then sum: the original's clipping on TPU.

    On a TPU v3-8 the original's `get_train_op` clips each core's gradient of (its mean loss / 8)
    (`CrossShardOptimizer` scales the loss by 1/num_shards) before the cross-core sum, so with a
    micro-batch per core (`loss / (grad_accum * world)` per micro-batch, summed over micro-batches
    and ranks) this reproduces it. Call `add()` after each backward, `finish()` before the step.
    """

    def __init__(self, params: Iterable[torch.Tensor], clip: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.clip = clip
        self.sums: list[torch.Tensor | None] = [None] * len(self.params)
        self.norms: list[float] = []

    @torch.no_grad()
    def add(self) -> None:
        """Clip the gradient now in .grad (one micro-batch's), add it to the sum, clear .grad.

        A parameter that got no gradient keeps none (the original skips None gradients)."""
        self.norms.append(clip_by_global_norm(self.params, self.clip))
        for k, p in enumerate(self.params):
            if p.grad is None:
                continue
            if self.sums[k] is None:
                self.sums[k] = p.grad.clone()
            else:
                cast(torch.Tensor, self.sums[k]).add_(p.grad)
            p.grad = None

    @torch.no_grad()
    def finish(self, all_reduce=None) -> float:
        """Put the summed gradients back into .grad (summed over ranks by `all_reduce`); the largest norm."""
        if not self.norms:
            raise RuntimeError("finish() before any add()")
        if all_reduce is not None:  # every rank reduces the same tensors: gaps become zeros
            filled = [
                s if s is not None else torch.zeros_like(p)
                for s, p in zip(self.sums, self.params, strict=True)
            ]
            flat = torch.cat([t.reshape(-1) for t in filled])  # one collective, not one per tensor
            all_reduce(flat)
            sizes = [t.numel() for t in filled]
            self.sums = [c.view_as(t) for c, t in zip(flat.split(sizes), filled, strict=True)]
        for p, g in zip(self.params, self.sums, strict=True):
            p.grad = g
        norm = max(self.norms)
        self.sums, self.norms = [None] * len(self.params), []
        return norm


def clip_gradients(optimizer: torch.optim.Optimizer, clip: float) -> float:
    """Clip all of the optimizer's gradients by their global norm; return the norm before clipping."""
    return clip_by_global_norm([p for group in optimizer.param_groups for p in group["params"]], clip)


def apply_update(
    optimizer: torch.optim.Optimizer, scheduler, step: Callable[[], object] | None = None
) -> None:
    """The rest of the original's order after clipping: layer-decay scale -> Adam -> schedule.

    ``step`` replaces ``optimizer.step`` where something wraps it (fp16's ``GradScaler.step``).
    """
    scale_gradients(optimizer)
    (step or optimizer.step)()
    if scheduler is not None:
        scheduler.step()


def optimizer_step(optimizer: torch.optim.Optimizer, scheduler, clip: float) -> float:
    """One update in the original's order: clip (global norm) -> layer-decay scale -> Adam -> schedule.

    Returns the gradient norm before clipping. (``train.engine.step.TrainStep`` runs the same two halves,
    with the non-finite check and the fp16 scaler between them.)
    """
    norm = clip_gradients(optimizer, clip)
    apply_update(optimizer, scheduler)
    optimizer.zero_grad(set_to_none=True)
    return norm


def lr_lambda(total_steps: int, warmup: int, decay: str = "linear", min_ratio: float = 0.0):
    """The lr multiplier at optimizer step `step` (0-based), as `model_utils.get_train_op`:

    step < warmup: step / warmup (the first update has lr 0, as the original's global_step 0);
    then linear ("poly", power 1) or cosine decay from 1 to `min_ratio` over total_steps - warmup.
    """
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")

    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return step / warmup
        if decay == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if decay == "linear":
            return min_ratio + (1 - min_ratio) * (1 - progress)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def make_scheduler(optimizer, total_steps: int, warmup: int, decay: str = "linear", min_ratio: float = 0.0):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, warmup, decay, min_ratio))
