"""Named model outputs -> predictions, whatever the head: the one switch from a head's outputs to an
answer (:func:`decode_head_outputs`), and the same over a whole set of questions from flat
per-feature outputs (:func:`decode_all_head_outputs`, :func:`decode_all`, :func:`decode_all_beam`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from qa_core.heads import head_spec

from .answerability import Answerability
from .answerability_features import ContextIndex
from .data import SquadExample
from .decode import DEFAULT_DECODING, ArrayLike, DecodeOptions, decode, decode_beam
from .features import Feature
from .prediction import Prediction


def simple_null_logit(start_logits: np.ndarray, end_logits: np.ndarray, feature: Feature) -> float:
    """No-answer logit for heads without an answerability output ("simple"): BERT's null score.

    ``start[cls] + end[cls]`` minus the best paragraph start + end logit: positive when the model
    prefers the `<cls>` "span" over every real one.
    """
    start = np.asarray(start_logits, dtype=np.float64)
    end = np.asarray(end_logits, dtype=np.float64)
    if feature.paragraph_len == 0:
        return 1e9
    best = float(start[: feature.paragraph_len].max() + end[: feature.paragraph_len].max())
    return float(start[feature.cls_index] + end[feature.cls_index]) - best


def decode_head_outputs(
    head: str,
    example_or_context: SquadExample | str,
    features: Sequence[Feature],
    rows: Sequence[Mapping[str, Any]],
    options: DecodeOptions = DEFAULT_DECODING,
    *,
    question: str | None = None,
    context_index: ContextIndex | None = None,
) -> Prediction:
    """Decode one question from its windows' named model outputs (``rows[w][name]``, the names of
    the head registry's ``outputs``), whatever the head: the one switch from a head's outputs to
    an answer, used by evaluation, the export's agreement check and the server."""
    spec = head_spec(head)
    kw: dict[str, Any] = {"question": question, "context_index": context_index}
    if spec.decoder == "beam":
        cls = np.array([float(r["cls_logits"]) for r in rows])
        return decode_beam(
            example_or_context,
            features,
            [r["start_top_log_probs"] for r in rows],
            [r["start_top_index"] for r in rows],
            [r["end_top_log_probs"] for r in rows],
            [r["end_top_index"] for r in rows],
            cls,
            options,
            **kw,
        )
    starts = [r["start_logits"] for r in rows]
    ends = [r["end_logits"] for r in rows]
    if not spec.has_answerability_output:  # the null span's score stands in for it
        cls = np.array([simple_null_logit(s, e, f) for s, e, f in zip(starts, ends, features, strict=True)])
    else:
        cls = np.array([float(r["cls_logits"]) for r in rows])
    return decode(example_or_context, features, starts, ends, cls, options, **kw)


def group_features(features: Sequence[Feature]) -> dict[int, list[int]]:
    """example_index -> indices (into ``features``) of its windows, in window order."""
    groups: dict[int, list[int]] = {}
    for i, f in enumerate(features):
        groups.setdefault(f.example_index, []).append(i)
    return groups


def decode_all(
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    start_logits: ArrayLike,
    end_logits: ArrayLike,
    cls_logits: ArrayLike,
    options: DecodeOptions = DEFAULT_DECODING,
) -> dict[str, Prediction]:
    """Decode every example from flat per-feature outputs (row i belongs to ``features[i]``).

    Rows may be a ``[F, T]`` array or a list of F arrays of any lengths >= their feature's (so
    batches padded to different lengths can simply be concatenated as lists). Returns qas_id ->
    Prediction for the examples that have features.
    """
    cls = np.asarray(cls_logits, dtype=np.float64).reshape(-1)
    outputs = {"start_logits": start_logits, "end_logits": end_logits, "cls_logits": cls}
    return decode_all_head_outputs("shallow", examples, features, outputs, options)


def decode_all_beam(
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    start_top_log_probs: ArrayLike,
    start_top_index: ArrayLike,
    end_top_log_probs: ArrayLike,
    end_top_index: ArrayLike,
    cls_logits: ArrayLike,
    options: DecodeOptions = DEFAULT_DECODING,
) -> dict[str, Prediction]:
    """:func:`decode_all` for the beam head's flat per-feature outputs."""
    outputs = {
        "start_top_log_probs": start_top_log_probs,
        "start_top_index": start_top_index,
        "end_top_log_probs": end_top_log_probs,
        "end_top_index": end_top_index,
        "cls_logits": np.asarray(cls_logits, dtype=np.float64).reshape(-1),
    }
    return decode_all_head_outputs("beam", examples, features, outputs, options)


def decode_all_head_outputs(
    head: str,
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    outputs: Mapping[str, ArrayLike],
    options: DecodeOptions = DEFAULT_DECODING,
) -> dict[str, Prediction]:
    """:func:`decode_head_outputs` for every example, from flat per-feature outputs by name
    (``outputs[name][i]`` belongs to ``features[i]``). Returns qas_id -> Prediction. Questions about
    one context share its :class:`ContextIndex` when a verifier needs one."""
    out: dict[str, Prediction] = {}
    indexes = SharedContextIndexes(options.answerability)
    for ex_i, idx in group_features(features).items():
        ex = examples[ex_i]
        rows = [{name: values[i] for name, values in outputs.items()} for i in idx]
        feats = [features[i] for i in idx]
        out[ex.qas_id] = decode_head_outputs(
            head, ex, feats, rows, options, context_index=indexes(ex.context)
        )
    return out


class SharedContextIndexes:
    """One :class:`ContextIndex` per context, shared by its questions, built only when the decision
    reads lexical evidence (a verifier); otherwise None for every context."""

    def __init__(self, answerability: Answerability | None) -> None:
        self.lexical = answerability is not None and answerability.uses_lexical
        self._by_context: dict[str, ContextIndex] = {}

    def __call__(self, context: str) -> ContextIndex | None:
        if not self.lexical:
            return None
        if context not in self._by_context:
            self._by_context[context] = ContextIndex(context)
        return self._by_context[context]
