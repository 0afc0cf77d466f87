"""A fine-tuning run's settings, one field per ``python -m train.finetune`` flag: read by the command, the
experiments, the recipe and its set-up, so it sits apart from all of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from train.common.contract import DEFAULTS
from train.engine.session import TrainingConfig


@dataclass(kw_only=True)
class FinetuneConfig(TrainingConfig):
    """Every setting of a fine-tuning run (the flags' help says what each does): the training settings
    of :class:`TrainingConfig` with fine-tuning's defaults, and its own."""

    AT_LEAST: ClassVar[dict[str, int]] = {
        **TrainingConfig.AT_LEAST,
        "eval_every": 1,
        "eval_batch_size": 1,
        "n_best": 1,
        "max_answer_len": 1,
    }

    recipe: str | None = None
    # data
    train_file: str | None = None
    dev_file: str | None = None
    max_seq_len: int = DEFAULTS.max_seq_len
    doc_stride: int = DEFAULTS.doc_stride
    max_query_len: int = DEFAULTS.max_query_len
    keep_out_of_window: float = 1.0
    plausible_spans: bool = False
    max_dev_examples: int | None = None
    # model
    config: str | None = None
    head: str = "shallow"
    start_n_top: int | None = None
    end_n_top: int | None = None
    answer_class_input: str | None = None
    activation: str | None = None
    question_match: bool = False
    freeze_layers: int = 0
    freeze_embeddings: bool = False
    # optimisation
    steps: int | None = None
    epochs: float = 2.0
    global_batch_size: int | None = None
    grad_accum: int | None = None
    lr: float = 3e-5
    layer_decay: float = 0.75
    layer_decay_on: str = "gradients"
    warmup: int | None = None
    clip_each_micro_batch: bool = False
    # evaluation and run
    keep_best: bool = False
    eval_every: int = 500
    eval_batch_size: int = 32
    answerability: str = "auto"
    calibration: str = "platt"
    rerank: bool = True  # fit a span re-ranker on the dev file with the answerability (not with cls)
    n_best: int = DEFAULTS.n_best
    max_answer_len: int = DEFAULTS.max_answer_len
    save_every: int = 500
