"""The training loop shared by pretraining and fine-tuning: steps, the stop decision, save cadence.

What differs between the two (what a step's data is, what is logged or evaluated, what a checkpoint
holds) comes in as callbacks; what must be the same everywhere lives here: a stop (Ctrl-C, SIGTERM,
``--stop-after``) is agreed by every rank at the same step and always ends with a checkpoint, and a
checkpoint is written every ``save_every`` steps and at the last step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from train.engine.execution import Dist, StopFlag, agree_any, all_reduce_mean
from train.engine.step import MicroLoss, StepOutcome, TrainStep


@dataclass(frozen=True)
class StepReport:
    """What the per-step callback sees."""

    step: int
    outcome: StepOutcome
    loss: float  # the step's loss averaged over ranks
    stopping: bool  # this is the last step of this invocation


@dataclass(frozen=True)
class LoopPlan:
    start_step: int
    total_steps: int
    save_every: int
    stop_after: int | None = None  # steps of this invocation (tests of resume)


def run_loop(
    trainer: TrainStep,
    micro_loss: MicroLoss,
    plan: LoopPlan,
    dist: Dist,
    *,
    after_step: Callable[[StepReport], None],
    save: Callable[[int], None],
) -> int:
    """Train from ``plan.start_step`` until ``plan.total_steps`` or a stop; returns the last step.

    ``after_step`` runs on every rank after each step (logging, progress, evaluation); ``save(step)``
    runs on every rank when a checkpoint is due (the callback decides which rank writes).
    """
    step, done = plan.start_step, 0
    with StopFlag() as stop:
        while step < plan.total_steps:
            outcome = trainer.step(micro_loss)
            step += 1
            done += 1
            loss = all_reduce_mean(outcome.loss, dist)
            stopping = agree_any(stop.requested, dist) or (
                plan.stop_after is not None and done >= plan.stop_after
            )
            after_step(StepReport(step, outcome, loss, stopping))
            if step % plan.save_every == 0 or step == plan.total_steps or stopping:
                save(step)
            if stopping:
                break
    return step
