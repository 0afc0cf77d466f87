"""What every recipe is to the engine: stages that ``run()`` calls in order, and the three hooks the
engine's loop calls each step. A recipe's config comes in whole; its training state lives on it."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from train.engine.loop import LoopPlan, StepReport, run_loop
from train.engine.session import Session
from train.engine.step import TrainStep


class Recipe(ABC):
    """``run()`` is ``setup()``, ``train()``, ``cleanup()``; ``train()`` runs the engine's loop over
    ``micro_loss``, ``after_step`` and ``save_checkpoint`` from the current step to ``loop_plan()``'s end."""

    session: Session
    trainer: TrainStep
    step: int

    def run(self) -> dict:
        self.setup()
        self.train()
        return self.cleanup()

    def train(self) -> int:
        """The engine's loop from the current step to the last (or a stop); returns the last step."""
        self.step = run_loop(
            self.trainer,
            self.micro_loss,
            self.loop_plan(),
            self.session.dist,
            after_step=self.after_step,
            save=self.save_checkpoint,
        )
        return self.step

    @abstractmethod
    def setup(self) -> None:
        """Open the run, data, model and optimiser; resume if asked."""

    @abstractmethod
    def loop_plan(self) -> LoopPlan:
        """Where the loop starts and stops, and how often it saves."""

    @abstractmethod
    def micro_loss(self, train_model: torch.nn.Module, micro: int) -> torch.Tensor:
        """The loss of one micro-batch."""

    @abstractmethod
    def after_step(self, r: StepReport) -> None:
        """Logging (and evaluation) after each optimizer step."""

    @abstractmethod
    def save_checkpoint(self, step: int) -> None:
        """The resumable state at ``step``."""

    @abstractmethod
    def cleanup(self) -> dict:
        """The final model, closed logs and process group; returns the run's summary."""
