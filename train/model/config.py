"""XLNet hyper-parameters as one dataclass, with presets and HF `config.json` conversion.

Field names follow HuggingFace's `XLNetConfig` wherever one exists, so a `config.json` written by
`transformers` loads here and ours loads there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from qa_core.contract import END_N_TOP, START_N_TOP

ACTIVATIONS = ("relu", "gelu", "gelu_new", "mish")
# What the beam head's answerability classifier reads besides `<cls>` while training:
# "softmax_start" = the start-probability-weighted state, in training as at inference (the original
# XLNet, function_builder.get_qa_outputs); "gold_start" = the state at the labelled start (HF).
ANSWER_CLASS_INPUTS = ("softmax_start", "gold_start")
# Settings of the pretraining run config that the original's fine-tuning leaves out
# (xlnet.create_run_config with is_finetune=True; XLNetModel always builds attn_type "bi"):
# fine-tuning, evaluation and serving reset them.
PRETRAINING_ONLY: dict[str, Any] = {
    "bi_data": False,
    "mem_len": None,
    "reuse_len": None,
    "same_length": False,
    "attn_type": "bi",
}


@dataclass
class XLNetConfig:
    """Model shape and behaviour. `d_head` is derived.

    Our extensions, off by default (HF and the original have neither): `use_aoa` adds
    Attention-on-Attention; `question_match` adds a learned vector to the embedding of every token
    that also occurs on the other side of `<sep>` (see `train.model.layout.question_match`).
    """

    vocab_size: int = 32000
    d_model: int = 768
    n_layer: int = 12
    n_head: int = 12
    d_inner: int = 3072
    ff_activation: str = "gelu"
    untie_r: bool = True
    attn_type: str = "bi"
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    mem_len: int | None = None
    reuse_len: int | None = None
    bi_data: bool = False
    clamp_len: int = -1
    same_length: bool = False
    start_n_top: int = START_N_TOP
    end_n_top: int = END_N_TOP
    pad_token_id: int = 5
    bos_token_id: int = 1
    eos_token_id: int = 2
    use_aoa: bool = False
    question_match: bool = False
    answer_class_input: str = "softmax_start"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    def validate(self) -> None:
        """Fail early with a message a user can act on, instead of a shape error deep in forward."""
        if self.d_model % self.n_head != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.d_model % 2 != 0:
            raise ValueError(f"d_model ({self.d_model}) must be even for the sinusoidal position encoding")
        if self.ff_activation not in ACTIVATIONS:
            raise ValueError(f"ff_activation must be one of {ACTIVATIONS}, got {self.ff_activation!r}")
        if self.attn_type not in ("bi", "uni"):
            raise ValueError(f"attn_type must be 'bi' or 'uni', got {self.attn_type!r}")
        for name in ("vocab_size", "n_layer", "n_head", "d_inner"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.answer_class_input not in ANSWER_CLASS_INPUTS:
            raise ValueError(
                f"answer_class_input must be one of {ANSWER_CLASS_INPUTS}, got {self.answer_class_input!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def replace(self, **changes: Any) -> XLNetConfig:
        """A copy with some fields changed (None values are ignored, which suits argparse overrides)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown XLNetConfig fields: {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def for_finetuning(self) -> XLNetConfig:
        """This config without the pretraining-only run settings (bi_data, memory, same_length, uni)."""
        return dataclasses.replace(self, **PRETRAINING_ONLY)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> XLNetConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**PRESETS[name]).replace(**overrides)

    # --- HuggingFace config.json -------------------------------------------------------------
    def to_hf_dict(self, architecture: str | None = None) -> dict[str, Any]:
        """A dict that `transformers.XLNetConfig.from_dict` accepts (our extras ride along)."""
        out: dict[str, Any] = {"model_type": "xlnet"}
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name] = getattr(self, f.name)
        out["d_head"] = self.d_head
        out["tie_word_embeddings"] = True
        if architecture:
            out["architectures"] = [architecture]
        out.update(self.extra)
        return out

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> XLNetConfig:
        """Read HF (any version, including old `n_token` files) or our own config.json."""
        if data.get("model_type", "xlnet") != "xlnet":
            raise ValueError(f"not an XLNet config (model_type={data.get('model_type')!r})")
        data = dict(data)
        if "n_token" in data and "vocab_size" not in data:
            data["vocab_size"] = data.pop("n_token")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: data[k] for k in names if k in data}
        if kwargs.get("ff_activation") == "gelu_pytorch_tanh":
            kwargs["ff_activation"] = "gelu_new"
        if "d_head" in data and data["d_head"] * data.get("n_head", 1) != data.get("d_model", 0):
            raise ValueError("d_head * n_head != d_model is not supported")
        return cls(**kwargs)


PRESETS: dict[str, dict[str, Any]] = {
    # Unit tests and the demo: a forward pass in milliseconds.
    "tiny": dict(d_model=64, n_layer=2, n_head=4, d_inner=256, vocab_size=32000, dropout=0.1),
    # Learns visibly in minutes on 2 CPU cores.
    "small": dict(d_model=256, n_layer=4, n_head=4, d_inner=1024, vocab_size=32000, dropout=0.1),
    # About 3x small's compute per token: a candidate for the "2 hours on 2 cores" budget.
    "medium": dict(d_model=384, n_layer=6, n_head=6, d_inner=1536, vocab_size=32000, dropout=0.1),
    # The published models (Yang et al. 2019, Table 7).
    "base": dict(d_model=768, n_layer=12, n_head=12, d_inner=3072, vocab_size=32000, dropout=0.1),
    "large": dict(d_model=1024, n_layer=24, n_head=16, d_inner=4096, vocab_size=32000, dropout=0.1),
}
