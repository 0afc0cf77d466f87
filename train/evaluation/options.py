"""What ``python -m train.evaluate`` (and the study's evaluation stage) takes: one
:class:`EvaluationOptions`, each field a flag of the command (:mod:`train.common.dataclass_flags`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qa_core.contract import WINDOW_AND_DECODING, ModelSettings, probability
from train.common.dataclass_flags import flag


@dataclass(frozen=True)
class EvaluationOptions:
    """A fine-tuned checkpoint, the SQuAD file it is scored on, where the prediction files go, and how
    it decides; checked on construction. The model settings not in ``overrides`` are the checkpoint's
    (:class:`qa_core.contract.ModelSettings` from its metadata)."""

    checkpoint: Path = flag(help="fine-tuned QA checkpoint directory")
    data: Path = flag(help="SQuAD 2.0 JSON with answers")
    out: Path = flag(help="directory for predictions.json, na_probs.json, nbest.json, metrics.json")
    threshold: float | None = flag(
        None, help="no-answer probability threshold, replacing the stored decision rule (default: metadata)"
    )
    answerability: str = flag(
        "stored",
        choices=("stored", "cls"),
        help="stored: the checkpoint's fitted answerability model (if any); cls: sigmoid(cls_logit) against "
        "the stored no_answer_threshold, ignoring a fitted model",
    )
    overrides: dict[str, Any] = flag(
        default_factory=dict, nested=ModelSettings, nested_only=WINDOW_AND_DECODING, overrides=True
    )  # --max-seq-len, --doc-stride, ...: the model settings replaced, by name (absent: the checkpoint's)
    batch_size: int = flag(32, help="windows per forward pass")
    device: str = flag("cpu", help="torch device")
    progress: bool = flag(True, help="a progress bar on stderr")

    def __post_init__(self) -> None:
        if self.threshold is not None and not probability(self.threshold):
            raise ValueError(f"--threshold must be a probability in [0, 1], got {self.threshold}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if unknown := set(self.overrides) - set(WINDOW_AND_DECODING):
            raise ValueError(f"settings an evaluation cannot override: {sorted(unknown)}")
