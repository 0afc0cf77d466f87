"""What ``python -m train.evaluate`` (and the study's evaluation stage) takes: one
:class:`EvaluationOptions`, each field a flag of the command (:mod:`train.common.dataclass_flags`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qa_core.contract import probability
from train.common.dataclass_flags import flag

# The model settings a caller may override; None keeps what the checkpoint's metadata records.
SETTING_OVERRIDES = ("max_seq_len", "doc_stride", "max_query_len", "max_answer_len", "n_best")


@dataclass(frozen=True)
class EvaluationOptions:
    """A fine-tuned checkpoint, the SQuAD file it is scored on, where the prediction files go, and how
    it decides; checked on construction. Window sizes, lengths and the n-best left None are the
    checkpoint's (:class:`qa_core.contract.ModelSettings` from its metadata)."""

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
    max_seq_len: int | None = flag(None, help="window length in tokens (default: the checkpoint's)")
    doc_stride: int | None = flag(None, help="stride between windows (default: the checkpoint's)")
    max_query_len: int | None = flag(None, help="question tokens kept (default: the checkpoint's)")
    max_answer_len: int | None = flag(None, help="longest answer in tokens (default: the checkpoint's)")
    n_best: int | None = flag(None, help="candidate spans kept per question (default: the checkpoint's)")
    batch_size: int = flag(32, help="windows per forward pass")
    device: str = flag("cpu", help="torch device")
    progress: bool = flag(True, help="a progress bar on stderr")

    def __post_init__(self) -> None:
        if self.threshold is not None and not probability(self.threshold):
            raise ValueError(f"--threshold must be a probability in [0, 1], got {self.threshold}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")

    def setting_overrides(self) -> dict[str, Any]:
        """The model settings this evaluation replaces (for ``ModelSettings.from_metadata``)."""
        return {name: getattr(self, name) for name in SETTING_OVERRIDES}
