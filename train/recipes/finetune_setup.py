"""What a fine-tuning run is set up from: the tokenizer and model it starts from (``--init`` or a random
``--config``), the layers it freezes, resumable shuffled batches over the training features, and the
batch sizes and accumulation its config asks for (a ``--recipe`` reproduces the original's devices).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qa_core.tokenizer import XLNetTokenizer
from train.model import XLNetConfig, XLNetForQuestionAnswering, checkpoint
from train.recipes.finetune_config import FinetuneConfig
from train.recipes.presets import RECIPES
from train.tokenizer import train_spm


def load_tokenizer_and_model(config: FinetuneConfig, out: Path):
    """--init PATH (backbone, and head if it matches) or a random --config model with its tokenizer."""
    overrides = config_overrides(config)
    if config.init:
        loaded = checkpoint.load(config.init, head=config.head, config_overrides=overrides)
        tokenizer = loaded.tokenizer
        if config.spm:
            tokenizer = load_spm(config.spm)
        if tokenizer is None:
            raise ValueError(f"{config.init} has no spiece.model; pass --spm")
        if tokenizer.vocab_size > loaded.config.vocab_size:
            raise ValueError(
                f"tokenizer vocab {tokenizer.vocab_size} > model vocab {loaded.config.vocab_size}"
            )
        return tokenizer, loaded.model, loaded.metadata
    if not config.config:
        raise ValueError("give --init PATH, or --config PRESET with --spm or --train-spm")
    if config.spm:
        tokenizer = load_spm(config.spm)
    else:
        tok_dir = out / "tokenizer"
        if not (tok_dir / "spiece.model").exists():
            assert config.train_file and config.dev_file  # check_data_files ran
            train_spm([config.train_file, config.dev_file], tok_dir, config.train_spm or 8000)
        tokenizer = XLNetTokenizer.from_dir(tok_dir)
    model_config = XLNetConfig.preset(
        config.config,
        vocab_size=tokenizer.vocab_size,
        ff_activation=config.activation,
        use_aoa=config.aoa or None,
        **overrides,
    )
    return tokenizer, XLNetForQuestionAnswering(model_config, head=config.head), {}


def config_overrides(config: FinetuneConfig) -> dict:
    """Model-config fields that fine-tuning flags set (None = keep the checkpoint's or preset's)."""
    fields = {
        "dropout": config.dropout,
        "start_n_top": config.start_n_top,
        "end_n_top": config.end_n_top,
        "answer_class_input": config.answer_class_input,
        "question_match": True if config.question_match else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def load_spm(path: str) -> XLNetTokenizer:
    p = Path(path)
    return XLNetTokenizer.from_dir(p) if p.is_dir() else XLNetTokenizer(p)


def freeze(model: XLNetForQuestionAnswering, n_layers: int, embeddings: bool) -> int:
    """Freeze the word embedding and/or the bottom N layers; returns the trainable parameter count."""
    if n_layers > model.config.n_layer:
        raise ValueError(f"--freeze-layers {n_layers} > n_layer {model.config.n_layer}")
    model.transformer.mask_emb.requires_grad_(False)  # query stream only: unused by QA
    if embeddings:
        model.transformer.word_embedding.weight.requires_grad_(False)
    for layer in model.transformer.layer[:n_layers]:
        for p in layer.parameters():
            p.requires_grad_(False)
    if not model.config.untie_r and 0 < n_layers < model.config.n_layer:
        for name in ("r_w_bias", "r_r_bias", "r_s_bias"):  # shared by all layers: keep them trainable
            getattr(model.transformer.layer[0].rel_attn, name).requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def trained_through_frozen(model: XLNetForQuestionAnswering, n_layers: int) -> list[str]:
    """Trainable parameters below or inside the frozen bottom layers (the word embedding, the
    question-match vector, tied attention biases).

    While there is one, backward passes through the frozen layers, so they keep the activations
    that passing needs; with none, autograd records nothing in them and they keep none.
    """
    if n_layers == 0:
        return []
    t = model.transformer
    below = [("word_embedding.weight", t.word_embedding.weight), ("match_emb", t.match_emb)]
    names = [name for name, p in below if p is not None and p.requires_grad]
    frozen = t.layer[:n_layers].named_parameters(prefix="layer")
    return names + [name for name, p in frozen if p.requires_grad]


class FeatureBatches:
    """Shuffled epochs over training features, resumable (epoch, position, RNG state)."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world: int = 1) -> None:
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world
        self.rng = np.random.default_rng(seed)
        self.epoch, self.pos = 0, 0
        self.order = self.rng.permutation(n)

    def next_indices(self) -> list[int]:
        span = self.batch_size * self.world
        if self.pos + span > self.n:
            self.epoch += 1
            self.pos = 0
            self.order = self.rng.permutation(self.n)
        chunk = self.order[self.pos : self.pos + span]
        self.pos += span
        return chunk[self.rank :: self.world].tolist()

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "order": self.order,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])
        self.order = np.asarray(s["order"])
        self.rng.bit_generator.state = s["rng"]


def micro_batch_size(config: FinetuneConfig, world_size: int) -> int:
    """--batch-size, or --global-batch-size split over ranks and accumulation steps."""
    if config.global_batch_size is None:
        return config.batch_size
    grad_accum = resolve_grad_accum(config, world_size)
    per_step = world_size * grad_accum
    if config.global_batch_size % per_step:
        raise ValueError(
            f"--global-batch-size {config.global_batch_size} is not divisible by ranks x --grad-accum "
            f"({world_size} x {grad_accum}); choose --grad-accum so that it is (with a recipe: "
            f"ranks x --grad-accum = the original's number of devices keeps its per-device clipping)"
        )
    return config.global_batch_size // per_step


def resolve_grad_accum(config: FinetuneConfig, world_size: int) -> int:
    """--grad-accum, else for a recipe the original's devices / ranks (one micro-batch per device)."""
    if config.grad_accum is not None:
        if config.grad_accum < 1:
            raise ValueError(f"--grad-accum must be at least 1, got {config.grad_accum}")
        return config.grad_accum
    if not config.recipe:
        return 1  # no recipe to reproduce: one micro-batch per rank and step
    devices = RECIPES[config.recipe]["devices"]
    if devices % world_size:
        raise ValueError(
            f"recipe {config.recipe} ran on {devices} devices, each clipping its own gradient; {world_size} "
            f"ranks cannot split that: run on a divisor of {devices} ranks, or give --grad-accum"
        )
    return max(1, devices // world_size)
