"""A pretraining run's settings, one field per ``python -m train.pretrain`` flag (its help beside it): read
by the command, the experiments, the recipe and the ``--init`` checks, so it sits apart from all of them."""

from __future__ import annotations

from dataclasses import dataclass

from train.common.dataclass_flags import flag
from train.data.config import PretrainDataConfig
from train.engine.session import TrainingConfig
from train.model import ACTIVATIONS, PRESETS

# The data pipeline's own defaults are the original's (seq 512, reuse 256, ...): the command takes its
# span knobs from there, and shorter windows that a small model trains on in minutes on 2 cores.
ORIGINAL = PretrainDataConfig()


@dataclass(kw_only=True)
class PretrainConfig(TrainingConfig):
    """Every setting of a pretraining run: the training settings of :class:`TrainingConfig` with
    pretraining's defaults, and its own."""

    # data
    corpus: list[str] | None = flag(
        None,
        help="plain-text files (blank line between documents), SQuAD JSON or JSONL files, prepared into the "
        "run directory's data/ first (default: the shipped sample)",
    )
    data: str | None = flag(
        None,
        help="a corpus prepared by python -m train.prepare_corpus: memory-mapped, nothing tokenized at start",
    )
    train_spm: int | None = flag(
        None,
        metavar="VOCAB_SIZE",
        help="train a sentencepiece model of this size on the corpus first (default 8000 when no --spm)",
    )
    lower: bool = flag(False, help="lower-case text (uncased model) when training the spm")
    seq_len: int = flag(128, help=f"tokens per example (the original: {ORIGINAL.seq_len})")
    reuse_len: int = flag(
        64, help=f"tokens cached as memory for the next batch (the original: {ORIGINAL.reuse_len})"
    )
    mem_len: int = flag(64, help="memory length in tokens (paper: 384)")
    perm_size: int | None = flag(None, help="local permutation size (default: reuse-len)")
    num_predict: int | None = flag(None, help="targets per example (default: seq-len // 6)")
    mask_alpha: int = flag(ORIGINAL.mask_alpha, help="context tokens per span unit")
    mask_beta: int = flag(ORIGINAL.mask_beta, help="tokens predicted per mask-alpha tokens")
    max_gram: int = flag(ORIGINAL.max_gram, help="longest span length")
    bi_data: bool = flag(ORIGINAL.bi_data, help="half of each batch reads the streams backwards")
    # model
    init: str | None = flag(
        None,
        help="continue pretraining this model: a HuggingFace XLNetLMHeadModel/XLNetModel directory or our "
        "checkpoint; its shape and spiece.model are used (flags that contradict them are refused)",
    )
    config: str = flag("small", choices=sorted(PRESETS), help="model size preset")
    n_layer: int | None = flag(None, help="layers (default: the preset's)")
    d_model: int | None = flag(None, help="hidden size (default: the preset's)")
    n_head: int | None = flag(None, help="attention heads (default: the preset's)")
    d_inner: int | None = flag(None, help="feed-forward size (default: the preset's)")
    activation: str = flag("gelu", choices=ACTIVATIONS, help="feed-forward activation")
    clamp_len: int = flag(-1, help="clamp relative distances (-1: no clamp)")
    # optimisation
    steps: int = flag(500, help="optimizer steps")
    grad_accum: int = flag(1, help="micro-batches per optimizer step")
    lr: float = flag(5e-4, help="peak learning rate (paper: 4e-4 base)")
    warmup: int = flag(50, help="linear warmup steps")
    # run
    save_every: int = flag(200, help="write a checkpoint every N steps")
