"""A fine-tuning run's settings, one field per ``python -m train.finetune`` flag: read by the command, the
experiments, the recipe and its set-up, so it sits apart from all of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qa_core.contract import MAX_N_BEST, WINDOW_AND_DECODING, ModelSettings
from train.answerability.fit import ANSWERABILITY_CHOICES, CALIBRATION_METHODS
from train.answerability.rerank_fit import RERANK_MODELS, RERANKER_HELP
from train.common.dataclass_flags import flag
from train.engine.optim import LAYER_DECAY_MODES
from train.engine.session import TrainingConfig
from train.model import ACTIVATIONS, HEADS, PRESETS
from train.model.config import ANSWER_CLASS_INPUTS
from train.recipes.presets import RECIPES


@dataclass(kw_only=True)
class FinetuneConfig(TrainingConfig):
    """Every setting of a fine-tuning run, each a flag of ``python -m train.finetune`` with its help: the
    training settings of :class:`TrainingConfig` with fine-tuning's defaults, and its own."""

    AT_LEAST: ClassVar[dict[str, int]] = {
        **TrainingConfig.AT_LEAST,
        "eval_every": 1,
        "eval_batch_size": 1,
        "n_best": 1,
        "max_answer_len": 1,
    }
    AT_MOST: ClassVar[dict[str, int]] = {"n_best": MAX_N_BEST}

    recipe: str | None = flag(
        None,
        choices=sorted(RECIPES),
        help="the original XLNet's published SQuAD 2.0 settings (train/recipes/presets.py); explicit flags win",
    )
    # data
    train_file: str | None = flag(None, help="SQuAD 2.0 JSON to train on (e.g. train-v2.0.json)")
    dev_file: str | None = flag(None, help="SQuAD 2.0 JSON with answers to evaluate on (e.g. dev-v2.0.json)")
    # --max-seq-len, --doc-stride, --max-query-len, --max-answer-len, --n-best: the model's settings, one
    # value (its fields, their help, their checks are ModelSettings'); the threshold is fitted, not a flag
    model: ModelSettings = flag(
        default_factory=ModelSettings, nested=ModelSettings, nested_only=WINDOW_AND_DECODING
    )
    keep_out_of_window: float = flag(
        1.0,
        help="share of training windows kept whose answerable question's answer is outside the window "
        "(1 = all, as the original)",
    )
    plausible_spans: bool = flag(
        False,
        help="train the span head on unanswerable questions' plausible answers too (their answerability "
        "label stays unanswerable; Read+Verify's auxiliary span targets)",
    )
    max_dev_examples: int | None = flag(None, help="evaluate on the first N dev questions only")
    # model
    init: str | None = flag(
        None, help="our pretraining/fine-tuned checkpoint or a HuggingFace XLNet directory"
    )
    config: str | None = flag(
        None, choices=sorted(PRESETS), help="random init of this preset (needs --spm/--train-spm)"
    )
    head: str = flag("shallow", choices=HEADS, help="QA head")
    start_n_top: int | None = flag(None, help="beam head: start candidates (config)")
    end_n_top: int | None = flag(None, help="beam head: end candidates per start (config)")
    answer_class_input: str | None = flag(
        None,
        choices=ANSWER_CLASS_INPUTS,
        help="beam head answerability input in training: softmax_start (original; the default of a "
        "new model) or gold_start (HF); default: keep the checkpoint's",
    )
    activation: str | None = flag(None, choices=ACTIVATIONS, help="feed-forward activation for random init")
    question_match: bool = flag(
        False,
        help="add the DrQA exact-match feature: a learned embedding on tokens that occur on both sides "
        "of <sep> (our extension; zero at the start, so a checkpoint without it begins unchanged)",
    )
    freeze_layers: int = flag(0, help="freeze the bottom N transformer layers")
    freeze_embeddings: bool = flag(False, help="freeze the word embedding")
    # optimisation
    steps: int | None = flag(None, help="optimizer steps")
    epochs: float = flag(2.0, help="passes over the training features, when --steps is not given")
    global_batch_size: int | None = flag(
        None, help="windows per optimizer step over all ranks and accumulation (sets --batch-size)"
    )
    grad_accum: int | None = flag(None, help="micro-batches per step (default 1; recipes: devices/ranks)")
    lr: float = flag(3e-5, help="peak learning rate of the top layer/head")
    layer_decay: float = flag(0.75, help="layer-wise decay rate (1 = off; original 0.75)")
    layer_decay_on: str = flag(
        "gradients",
        choices=LAYER_DECAY_MODES,
        help="gradients: layer l's clipped gradients x rate^(n_layer-1-l) (original); "
        "learning-rate: lr x rate^(depth from the top), embeddings lowest (much stronger)",
    )
    warmup: int | None = flag(None, help="warmup steps (default 10% of the steps)")
    clip_each_micro_batch: bool = flag(
        False,
        help="clip each micro-batch's (and rank's) gradient before summing, as the original per TPU core",
    )
    # evaluation and run
    keep_best: bool = flag(
        False,
        help="also keep the checkpoint with the highest dev best_f1 in OUT/best (selected on the dev file)",
    )
    eval_every: int = flag(500, help="evaluate on the dev file every N steps")
    eval_batch_size: int = flag(32, help="windows per forward pass when evaluating")
    answerability: str = flag(
        "auto",
        choices=ANSWERABILITY_CHOICES,
        help="how the final model decides to answer: a question verifier fitted on the training questions, "
        "alone (verifier-only) or combined with the model's scores (verifier), calibrated and given a decision "
        "rule by cross-fitting over the dev file's articles; auto keeps whichever cross-validates better; "
        "model-scores; or cls (a threshold on sigmoid(cls_logit), as before)",
    )
    calibration: str = flag(
        "platt", choices=CALIBRATION_METHODS, help="calibration of P(answerable) for verifier / model-scores"
    )
    rerank: bool = flag(
        True,
        help="fit a span re-ranker on the dev file with the answerability (every answerability but cls); "
        "--no-rerank keeps the reader's own span order",
    )
    reranker: str = flag("linear", choices=RERANK_MODELS, help=RERANKER_HELP)
    save_every: int = flag(500, help="write a checkpoint every N steps")
