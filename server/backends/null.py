"""The null backend: the model's output names and shapes, fixed values, no compute.

For measuring the server itself (``bench.serve --backend null``): every request takes the real path
(HTTP, the door, tokenizing, windows, the batcher, decoding, JSON) while the engine costs nothing, so
what a request costs beyond it is the host path alone, on any machine. The values are a fixed pattern
over positions (the same for every input), so decoding does the work it does for a real model: spans
are ranked, cut to the answer length, mapped back to characters and decided. Answers are meaningless;
the server says so in its log and in ``/v1/model`` (``backend: null``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from qa_core.heads import head_spec
from server.answering.model_spec import ModelSpec
from server.backends.base import Backend
from server.settings import ServerSettings

logger = logging.getLogger("server")

# A logit pattern with a clear best start and end a few tokens apart, repeating every PERIOD positions.
PERIOD = 37
NULL_CLS_LOGIT = -1.0  # sigmoid(-1) = 0.27: "probably answerable", so the decision rule runs in full


def _pattern(length: int, peak: int) -> np.ndarray:
    """Logits over ``length`` positions peaking at ``peak`` modulo ``PERIOD``."""
    positions = np.arange(length)
    return (-0.25 * np.abs((positions % PERIOD) - peak)).astype(np.float32)


class NullBackend(Backend):
    """Returns fixed outputs of the right names, dtypes and shapes for the spec's head."""

    name = "null"

    @classmethod
    def from_settings(cls, spec: ModelSpec, settings: ServerSettings) -> NullBackend:
        return cls(spec)

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        logger.warning("backend null: answers are a fixed pattern, not a model's (for measuring the server)")
        self.decoder = head_spec(spec.head).decoder
        longest = max(spec.serving.max_seq_len, spec.max_engine_seq_len or 0)
        self._start = _pattern(longest, 5)
        self._end = _pattern(longest, 8)
        k1, k2 = spec.serving.start_n_top, spec.serving.end_n_top
        self._start_top_lp = np.log(np.full(k1, 1.0 / k1, dtype=np.float32))
        self._start_top_ix = np.arange(k1, dtype=np.int64)
        self._end_top_lp = np.log(np.full(k1 * k2, 1.0 / k2, dtype=np.float32))
        self._end_top_ix = (self._start_top_ix[:, None] + np.arange(k2)[None, :]).reshape(-1)

    def run(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, length = batch["input_ids"].shape
        cls = np.full(rows, NULL_CLS_LOGIT, dtype=np.float32)
        if self.decoder == "beam":
            values = {
                "start_top_log_probs": np.broadcast_to(self._start_top_lp, (rows, self._start_top_lp.size)),
                "start_top_index": np.broadcast_to(self._start_top_ix, (rows, self._start_top_ix.size)),
                "end_top_log_probs": np.broadcast_to(self._end_top_lp, (rows, self._end_top_lp.size)),
                "end_top_index": np.broadcast_to(self._end_top_ix, (rows, self._end_top_ix.size)),
                "cls_logits": cls,
            }
        else:
            values = {
                "start_logits": np.broadcast_to(self._start[:length], (rows, length)),
                "end_logits": np.broadcast_to(self._end[:length], (rows, length)),
                "cls_logits": cls,
            }
        return {name: values[name] for name in self.output_names}

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "device": "none", "note": "fixed outputs, no model: for benchmarks"}
