"""``train.pretrain --init DIR``: continue pretraining a published model or one of our checkpoints.

DIR is a HuggingFace ``XLNetLMHeadModel`` or ``XLNetModel`` directory (config.json, weights,
spiece.model) or a checkpoint of ours. The model's shape and tokenizer are DIR's: a flag that would
change them (a size preset or dimension, the activation, AoA, another ``--spm``, ``--train-spm``) is
refused in one line that names the flag and DIR's value, because the run would otherwise train another
model than the user asked for, or feed it ids of another vocabulary. What the original's pretraining
run config sets (memory, reuse, bi_data, clamp_len, dropout) and every optimisation flag stay the
command line's, with their usual defaults. On ``--resume`` the run's newest checkpoint stands in for
DIR (same shape, same tokenizer), so a resumed run does not need DIR any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qa_core.tokenizer import XLNetTokenizer
from train.data.prepare import load_tokenizer
from train.data.shards import ShardedCorpus
from train.engine.state import latest_checkpoint
from train.model import PRESETS, XLNetConfig, XLNetLMHeadModel, checkpoint
from train.recipes.pretrain_config import PretrainConfig

# The model's dimensions (a --config preset sets all four): DIR decides them, as its activation and AoA.
SHAPE_FIELDS = ("n_layer", "d_model", "n_head", "d_inner")


def given(config: PretrainConfig, name: str) -> bool:
    """Was this flag set? The command line says so; from code, a value other than the default counts."""
    if config.explicit_flags is not None:
        return name in config.explicit_flags
    return getattr(config, name) != getattr(type(config).defaults(), name)


def run_settings(config: PretrainConfig) -> dict[str, Any]:
    """What the pretraining run decides over the stored config (None keeps the stored value)."""
    return {
        "mem_len": config.mem_len,
        "reuse_len": config.reuse_len,
        "bi_data": config.bi_data,
        "clamp_len": config.clamp_len,
        "dropout": config.dropout,
    }


@dataclass(frozen=True)
class InitSource:
    """The model a run starts from: its directory, stored config and tokenizer (weights not read yet)."""

    path: Path
    config: XLNetConfig
    tokenizer: XLNetTokenizer

    @classmethod
    def open(cls, config: PretrainConfig) -> InitSource:
        """``--init`` (or the run's newest checkpoint on ``--resume``), checked against the flags."""
        assert config.init is not None
        latest = latest_checkpoint(Path(config.out)) if config.resume else None
        path = latest or Path(config.init)
        source = cls(path, checkpoint.read_config(path), cls._tokenizer(config, path))
        source.check_flags(config)
        return source

    @staticmethod
    def _tokenizer(config: PretrainConfig, path: Path) -> XLNetTokenizer:
        if config.train_spm:
            raise ValueError(f"--train-spm: --init {config.init} brings its tokenizer (its spiece.model)")
        if not (path / "spiece.model").is_file():
            if not config.spm:
                raise ValueError(f"--init {path} has no spiece.model: pass --spm (the model's tokenizer)")
            return load_tokenizer(config.spm, config.lower)
        own = XLNetTokenizer.from_dir(path)
        if config.spm:
            other = load_tokenizer(config.spm, config.lower)
            if other.fingerprint() != own.fingerprint():
                raise ValueError(
                    f"--spm {config.spm} (tokenizer {other.fingerprint()[:12]}) is not the tokenizer of --init "
                    f"{path} ({own.fingerprint()[:12]}): drop --spm, the checkpoint brings its own"
                )
        elif config.lower and not own.do_lower_case:
            raise ValueError(f"--lower: the tokenizer of --init {path} is cased (do_lower_case false)")
        return own

    def check_flags(self, config: PretrainConfig) -> None:
        """Refuse flags that contradict the checkpoint's shape or vocabulary (one line, both values)."""
        mine = self.config
        wanted: dict[str, tuple[str, Any, Any]] = {}
        if given(config, "config"):
            preset = PRESETS[config.config]
            for name in SHAPE_FIELDS:
                wanted[name] = (f"--config {config.config}", preset[name], getattr(mine, name))
        for name in SHAPE_FIELDS:
            if given(config, name):
                flag = f"--{name.replace('_', '-')}"
                wanted[name] = (f"{flag} {getattr(config, name)}", getattr(config, name), getattr(mine, name))
        if given(config, "activation"):
            wanted["ff_activation"] = (
                f"--activation {config.activation}",
                config.activation,
                mine.ff_activation,
            )
        if given(config, "aoa"):
            wanted["use_aoa"] = ("--aoa", True, mine.use_aoa)
        for name, (flag, value, stored) in wanted.items():
            if value != stored:
                raise ValueError(
                    f"{flag} contradicts --init {self.path} ({name} {stored}): the model comes from the "
                    "checkpoint; drop the flag"
                )
        if self.tokenizer.vocab_size > mine.vocab_size:
            raise ValueError(
                f"the tokenizer of --init {self.path} has {self.tokenizer.vocab_size} pieces, more than the "
                f"model's vocab_size {mine.vocab_size}"
            )
        if config.data:
            corpus = ShardedCorpus(config.data)
            corpus.require_tokenizer(self.tokenizer.fingerprint(), f"--init {self.path}")

    def load_model(self, config: PretrainConfig) -> XLNetLMHeadModel:
        """The LM model with DIR's weights (a base model gets a zero output bias; the output layer is
        the word embedding, as HF ties it)."""
        loaded = checkpoint.load(self.path, kind="lm", config_overrides=run_settings(config))
        model = loaded.model
        assert isinstance(model, XLNetLMHeadModel)
        return model.train()
