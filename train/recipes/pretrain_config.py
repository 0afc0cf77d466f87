"""A pretraining run's settings, one field per ``python -m train.pretrain`` flag: read by the command, the
experiments, the recipe and the ``--init`` checks, so it sits apart from all of them."""

from __future__ import annotations

from dataclasses import dataclass

from train.engine.session import TrainingConfig


@dataclass(kw_only=True)
class PretrainConfig(TrainingConfig):
    """Every setting of a pretraining run (the flags' help says what each does): the training settings
    of :class:`TrainingConfig` with pretraining's defaults, and its own."""

    # data
    corpus: list[str] | None = None
    data: str | None = None
    lower: bool = False
    seq_len: int = 128
    reuse_len: int = 64
    mem_len: int = 64
    perm_size: int | None = None
    num_predict: int | None = None
    mask_alpha: int = 6
    mask_beta: int = 1
    max_gram: int = 5
    bi_data: bool = False
    # model
    config: str = "small"
    n_layer: int | None = None
    d_model: int | None = None
    n_head: int | None = None
    d_inner: int | None = None
    activation: str = "gelu"
    clamp_len: int = -1
    # optimisation
    steps: int = 500
    grad_accum: int = 1
    lr: float = 5e-4
    warmup: int = 50
    # run
    save_every: int = 200
