"""Configuration of the XLNet pretraining data pipeline, validated up front.

Every constraint the original `data_utils.py` enforced with a bare `assert` (or silently relied on) is
checked here once, with a message that says which knob to turn.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

#: `<sep>` + `<sep>` + `<cls>` appended after the reuse part and segment A/B.
NUM_FUNCTIONAL = 3


@dataclass(frozen=True)
class PretrainDataConfig:
    """Knobs of the pretraining data pipeline (names follow the original flags).

    seq_len:     tokens per example (`reuse_len` carried over + A + `<sep>` + B + `<sep>` + `<cls>`).
    reuse_len:   tokens at the start of each example whose hidden states the model caches as memory;
                 also how far a stream advances per batch.
    num_predict: targets per example; `None` -> `seq_len // 6` (the paper's K = 6; 85 for 512).
    perm_size:   length of the local permutations; `None` -> `reuse_len` (as in the original scripts).
    mask_alpha / mask_beta: about `mask_beta` tokens are predicted per `mask_alpha` tokens of context.
    max_gram:    longest span (in tokens) sampled for partial prediction.
    bi_data:     half of each rank's batch reads the streams backwards (needs an even batch_size).
    batch_size:  rows per batch *per rank* (each rank owns `batch_size` streams).
    seed:        seeds the numpy Generator (combined with the rank).
    """

    seq_len: int = 512
    reuse_len: int = 256
    num_predict: int | None = None
    perm_size: int | None = None
    mask_alpha: int = 6
    mask_beta: int = 1
    max_gram: int = 5
    bi_data: bool = False
    batch_size: int = 8
    seed: int = 42

    def __post_init__(self) -> None:
        if self.num_predict is None:
            object.__setattr__(self, "num_predict", self.seq_len // 6)
        if self.perm_size is None:
            object.__setattr__(self, "perm_size", self.reuse_len)
        self._validate()

    @property
    def non_reuse_len(self) -> int:
        """Tokens after the reuse part: A + `<sep>` + B + `<sep>` + `<cls>`."""
        return self.seq_len - self.reuse_len

    @property
    def ab_len(self) -> int:
        """Tokens shared by segments A and B (`tot_len` in the original)."""
        return self.seq_len - self.reuse_len - NUM_FUNCTIONAL

    @property
    def num_predict_reuse(self) -> int:
        """Targets sampled in the reuse part (the original gives it the larger half)."""
        assert self.num_predict is not None
        return self.num_predict - self.num_predict // 2

    @property
    def num_predict_rest(self) -> int:
        """Targets sampled in A + B (the `<sep>`/`<cls>` tokens are never targets)."""
        assert self.num_predict is not None
        return self.num_predict // 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _validate(self) -> None:
        for name in ("seq_len", "reuse_len", "mask_alpha", "mask_beta", "max_gram", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.reuse_len >= self.seq_len:
            raise ValueError(
                f"reuse_len ({self.reuse_len}) must be smaller than seq_len ({self.seq_len}): each example is "
                "reuse_len carried-over tokens + segment A + <sep> + segment B + <sep> + <cls>"
            )
        if self.ab_len < 2:
            raise ValueError(
                f"seq_len - reuse_len - 3 = {self.ab_len} leaves no room for both segments A and B "
                f"(need >= 2); lower reuse_len ({self.reuse_len}) or raise seq_len ({self.seq_len})"
            )
        perm = self.perm_size
        if not isinstance(perm, int) or perm < 1:
            raise ValueError(f"perm_size must be a positive integer, got {perm!r}")
        if perm > self.reuse_len or perm > self.non_reuse_len:
            raise ValueError(
                f"perm_size ({perm}) must be <= reuse_len ({self.reuse_len}) and <= seq_len - reuse_len "
                f"({self.non_reuse_len}): a longer permutation would leak across the reuse boundary"
            )
        if self.reuse_len % perm or self.non_reuse_len % perm:
            hint = math.gcd(self.reuse_len, self.non_reuse_len)
            raise ValueError(
                f"perm_size ({perm}) must divide both reuse_len ({self.reuse_len}) and seq_len - reuse_len "
                f"({self.non_reuse_len}) (the local permutations tile each part); e.g. perm_size={hint}"
            )
        if self.mask_alpha < self.mask_beta:
            raise ValueError(
                f"mask_alpha ({self.mask_alpha}) must be >= mask_beta ({self.mask_beta}): about mask_beta "
                "tokens are predicted per mask_alpha tokens of context"
            )
        num_predict = self.num_predict
        if not isinstance(num_predict, int) or num_predict < 1:
            raise ValueError(
                f"num_predict must be a positive integer, got {num_predict!r} (seq_len={self.seq_len} // 6 "
                "is 0 when num_predict is left to its default: set it explicitly)"
            )
        if self.num_predict_reuse > self.reuse_len or self.num_predict_rest > self.ab_len:
            raise ValueError(
                f"num_predict ({num_predict}) is too large: the reuse part gets {self.num_predict_reuse} "
                f"targets out of reuse_len={self.reuse_len} tokens and segments A+B get "
                f"{self.num_predict_rest} out of seq_len - reuse_len - 3 = {self.ab_len} tokens"
            )
        if self.bi_data and self.batch_size % 2:
            raise ValueError(
                f"bi_data=True needs an even batch_size (half of each rank's rows read the streams forwards, "
                f"half backwards), got batch_size={self.batch_size}"
            )
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
