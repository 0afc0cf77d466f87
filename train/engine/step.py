"""One optimizer step over gradient-accumulation micro-batches, shared by pretraining and fine-tuning.

Mixed precision: bf16 autocasts without a scaler (its exponent range is fp32's); fp16 autocasts with
``torch.amp.GradScaler`` (small gradients would underflow to zero otherwise), which is unscaled before
clipping, so clipping and the reported norm see true gradients. Under DDP, micro-batches before the
last skip the all-reduce (``no_sync``): gradients are reduced once per step, not once per micro-batch.

Non-finite gradients are caught *before* the optimizer runs: the step is skipped (weights, optimizer
moments and the learning-rate schedule untouched), counted, and after ``max_bad_steps`` skips in a row
the run stops with :class:`NonFiniteGradients`. Under DDP the check reads the all-reduced gradients,
so every rank takes the same decision.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch

from train.engine.execution import Dist, autocast
from train.engine.optim import MicroBatchClipping, apply_update, clip_gradients

MAX_BAD_STEPS = 8  # skipped steps in a row before a run is declared diverged (fp16 warm-up needs a few)
TRAINING_PRECISIONS = ("fp32", "bf16", "fp16")

MicroLoss = Callable[[torch.nn.Module, int], torch.Tensor]


class NonFiniteGradients(FloatingPointError):
    """Too many consecutive steps had NaN/inf gradients: the run diverged."""


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: this rank's mean micro-batch loss, the gradient norm, whether it was skipped."""

    loss: float
    grad_norm: float
    skipped: bool


class TrainStep:
    """Owns the step mechanics (autocast, scaler, DDP wrapper, clipping, skip rules) for one model.

    ``step(micro_loss)`` calls ``micro_loss(train_model, i)`` for each micro-batch ``i`` (inside
    autocast) and expects the micro-batch's mean loss; the division for accumulation happens here.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        *,
        dist: Dist,
        precision: str = "fp32",
        grad_accum: int = 1,
        clip: float = 1.0,
        clip_each_micro_batch: bool = False,
        max_bad_steps: int = MAX_BAD_STEPS,
    ) -> None:
        if precision not in TRAINING_PRECISIONS:
            raise ValueError(f"precision must be one of {TRAINING_PRECISIONS}, got {precision!r}")
        if grad_accum < 1 or max_bad_steps < 1:
            raise ValueError("grad_accum and max_bad_steps must be at least 1")
        if precision == "fp16" and clip_each_micro_batch:
            raise ValueError("--clip-each-micro-batch clips scaled fp16 gradients: use bf16 or fp32 with it")
        autocast(precision, dist.device)  # refuses fp16 on CPU with a clear message, before any work
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.dist, self.precision, self.grad_accum, self.clip = dist, precision, grad_accum, clip
        self.max_bad_steps = max_bad_steps
        self.train_model = torch.nn.parallel.DistributedDataParallel(model) if dist.enabled else model
        self.clipper = MicroBatchClipping(model.parameters(), clip) if clip_each_micro_batch else None
        # With per-micro-batch clipping every rank's micro-batch is one "core": sum over ranks by hand.
        self.loss_divisor = grad_accum * (dist.world_size if self.clipper is not None else 1)
        self.scaler = torch.amp.GradScaler(dist.device.type, enabled=precision == "fp16")
        self.skipped_total = 0
        self.skipped_in_row = 0

    @classmethod
    def from_args(
        cls, model, optimizer, scheduler, dist: Dist, args, trainer_state: dict | None = None
    ) -> TrainStep:
        """The step a training CLI's flags describe (``--precision``, ``--grad-accum``, ``--clip``,
        ``--clip-each-micro-batch``), resumed from a checkpoint's ``extra["trainer"]`` when given."""
        step = cls(
            model,
            optimizer,
            scheduler,
            dist=dist,
            precision=args.precision,
            grad_accum=args.grad_accum,
            clip=args.clip,
            clip_each_micro_batch=getattr(args, "clip_each_micro_batch", False),
        )
        if trainer_state is not None:
            step.load_state_dict(trainer_state)
        return step

    def _sync_context(self, micro: int):
        """DDP all-reduces only at the last micro-batch (per-micro-batch clipping reduces by hand)."""
        last = micro == self.grad_accum - 1 and self.clipper is None
        if not self.dist.enabled or last:
            return contextlib.nullcontext()
        return cast(torch.nn.parallel.DistributedDataParallel, self.train_model).no_sync()  # dist.enabled

    def step(self, micro_loss: MicroLoss) -> StepOutcome:
        self.train_model.train()
        total = torch.zeros((), dtype=torch.float64)
        for micro in range(self.grad_accum):
            with self._sync_context(micro):
                with autocast(self.precision, self.dist.device):
                    loss = micro_loss(self.train_model, micro)
                self.scaler.scale(loss.float() / self.loss_divisor).backward()
            if self.clipper is not None:
                self.clipper.add()
            total += loss.detach().double().cpu()
        self.scaler.unscale_(self.optimizer)
        if self.clipper is not None:
            norm = self.clipper.finish(all_reduce=torch.distributed.all_reduce if self.dist.enabled else None)
            # The largest of the micro-batch norms (max skips NaN), and only this rank's: check the
            # summed gradients themselves, which every rank shares.
            finite = math.isfinite(norm) and self._gradients_finite()
        else:  # the global norm of the (all-reduced) gradients is NaN/inf if any of them is
            norm = clip_gradients(self.optimizer, self.clip)
            finite = math.isfinite(norm)
        if finite:
            scaler_step = (lambda: self.scaler.step(self.optimizer)) if self.scaler.is_enabled() else None
            apply_update(self.optimizer, self.scheduler, scaler_step)  # the original's order
        if self.scaler.is_enabled():  # fp16: an overflow halves the loss scale (and restarts its growth)
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self._count(finite, norm)
        return StepOutcome(loss=float(total) / self.grad_accum, grad_norm=norm, skipped=not finite)

    def _gradients_finite(self) -> bool:
        """Every gradient finite? Under DDP the gradients are all-reduced, so every rank gets the same
        answer."""
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True

    def _count(self, finite: bool, norm: float) -> None:
        if finite:
            self.skipped_in_row = 0
            return
        self.skipped_total += 1
        self.skipped_in_row += 1
        if self.skipped_in_row >= self.max_bad_steps:
            raise NonFiniteGradients(
                f"{self.skipped_in_row} steps in a row had non-finite gradients (norm {norm}); the weights "
                "were not updated by them. Lower --lr, raise --warmup, or use --precision fp32/bf16"
            )

    def state_dict(self) -> dict:
        """What a resume needs besides model/optimizer/scheduler: the fp16 loss scale and skip counts."""
        return {"scaler": self.scaler.state_dict(), "skipped_total": self.skipped_total}

    def load_state_dict(self, state: dict) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_total = int(state.get("skipped_total", 0))
