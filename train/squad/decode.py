"""Model outputs -> answers in the original context (the original XLNet ``write_predictions``).

Two heads are supported:

* :func:`decode` for independent start/end logits ("shallow" head) plus a no-answer logit;
* :func:`decode_beam` for the original XLNet beam head, whose top-k start and (start-conditioned)
  end log-probabilities are computed inside the model (so an ONNX/TensorRT engine returns them).

A span's **score** is ``start_log_prob + end_log_prob`` (log-probabilities within its window);
n-best probabilities are a softmax over the n-best scores. Spans must start on a token whose
max-context window is the current one (so each start is decoded once, in the window where it sees
the most context), end at or after the start, stay within ``max_answer_len`` tokens and lie in the
paragraph. Offsets are characters of the original context: ``context[start:end] == text``.

Whether to answer is decided by :mod:`train.squad.answerability` from the model's scores (the
minimum over windows of ``cls_logit``, the logit that the question is unanswerable: a window that
does not hold the answer *should* call the question unanswerable from what it sees, so only the most
confident "answerable" window carries evidence; the null span's log-probability; the best span's)
and, when the model carries a fitted verifier, lexical evidence about the question and the best
span's sentence. Without one, the no-answer probability is ``sigmoid(min cls_logit)`` against the
threshold (0.5 by default), as in the original. A question judged unanswerable gets text "" but its
n-best list keeps the spans, so the decision can be revisited later (:func:`answers_and_na_probs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from train.common.contract import DEFAULTS, OUTPUT_NAMES

from .answerability import Answerability, ContextIndex, SpanScores, decide
from .answerability import sigmoid as sigmoid
from .data import SquadExample
from .features import Feature, span_text

ArrayLike = np.ndarray | Sequence[float] | Sequence[np.ndarray]

_MASKED = -1e30


@dataclass
class NBestEntry:
    """One candidate span: text and character offsets in the context, plus where it came from."""

    text: str
    start: int
    end: int
    score: float
    probability: float
    start_log_prob: float
    end_log_prob: float
    window_index: int
    start_token: int
    end_token: int


@dataclass
class Prediction:
    """The decoded answer to one question.

    ``text`` is "" and ``start == end == -1`` when the question is judged unanswerable (or no span
    was valid); ``n_best`` (best first) still holds the spans, ``n_best[0]`` being the best one.
    """

    qas_id: str
    text: str
    start: int
    end: int
    score: float
    no_answer_prob: float
    null_logit: float
    is_impossible: bool
    n_best: list[NBestEntry] = field(default_factory=list)
    answerable_prob: float = 0.5  # calibrated when the model carries a fitted answerability model
    threshold: float = DEFAULTS.no_answer_threshold  # the threshold on no_answer_prob it was decided at
    null_log_prob: float | None = None  # best window's log P(start = end = <cls>); None for the beam head

    @property
    def best_span_text(self) -> str:
        """The best non-null span's text, whatever the threshold decided ("" if there is none)."""
        return self.n_best[0].text if self.n_best else ""

    def span_scores(self) -> SpanScores:
        """The decoder's numbers for this question: what an answerability model reads."""
        best = self.n_best[0] if self.n_best else None
        return SpanScores(
            cls_logit=self.null_logit,
            null_log_prob=self.null_log_prob,
            best_log_prob=best.score if best is not None else None,
            best_probability=best.probability if best is not None else 0.0,
            best_start=best.start if best is not None else -1,
            best_end=best.end if best is not None else -1,
        )

    def redecided(self, deciding: Deciding, context: str) -> Prediction:
        """This prediction decided again under another answerability model or threshold (the spans
        and scores are kept: no model run is needed to compare decision rules)."""
        d = decide(
            deciding.rule(),
            deciding.question,
            deciding.index or context,
            self.span_scores(),
            deciding.threshold,
        )
        best = None if d.is_impossible or not self.n_best else self.n_best[0]
        return replace(
            self,
            text=best.text if best is not None else "",
            start=best.start if best is not None else -1,
            end=best.end if best is not None else -1,
            no_answer_prob=d.no_answer_prob,
            is_impossible=d.is_impossible,
            answerable_prob=d.answerable_prob,
            threshold=d.threshold,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (plain Python numbers)."""
        return asdict(self)


def _masked_log_softmax(logits: np.ndarray, p_mask: np.ndarray) -> np.ndarray:
    """log-softmax over positions with p_mask == 0 (paragraph and <cls>), as the original head."""
    x = np.where(p_mask.astype(bool), _MASKED, logits.astype(np.float64))
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def _row(values: ArrayLike, i: int, length: int) -> np.ndarray:
    """Feature ``i``'s row of a [F, T] array or a list of per-feature arrays, cut to its length."""
    row = np.asarray(values[i], dtype=np.float64).reshape(-1)
    if row.shape[0] < length:
        raise ValueError(f"logits for feature {i} have {row.shape[0]} positions, the feature has {length}")
    return row[:length]


def _top(indices: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` indices (from ``indices``) with the highest scores, best first."""
    if indices.size > k:
        part = np.argpartition(-scores[indices], k - 1)[:k]
        indices = indices[part]
    return indices[np.argsort(-scores[indices], kind="stable")]


def _context_and_id(example_or_context: SquadExample | str) -> tuple[str, str]:
    if isinstance(example_or_context, SquadExample):
        return example_or_context.context, example_or_context.qas_id
    return example_or_context, ""


@dataclass(frozen=True)
class Deciding:
    """How a decoded question is decided: the model's answerability (None: sigmoid(cls) against
    ``threshold``), the question's text (for a verifier's lexical features), and the caller's own
    threshold on the no-answer probability, which replaces the stored rule."""

    answerability: Answerability | None = None
    question: str = ""
    threshold: float | None = None
    index: ContextIndex | None = None  # the context's stems and sentences, shared by its questions

    def rule(self) -> Answerability:
        if self.answerability is not None:
            return self.answerability
        return Answerability.cls_only(
            DEFAULTS.no_answer_threshold if self.threshold is None else self.threshold
        )


class _Candidates:
    """Valid spans of all windows as parallel arrays (ranked once, turned into text lazily)."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(
        self, window: int, start_lp: np.ndarray, end_lp: np.ndarray, start: np.ndarray, end: np.ndarray
    ) -> None:
        if start.size:
            self.parts.append((start_lp + end_lp, start_lp, end_lp, np.full(start.size, window), start, end))

    def ranked(self) -> list[tuple[float, float, float, int, int, int]]:
        """``(score, start_lp, end_lp, window, start_tok, end_tok)``, best score first (stable)."""
        if not self.parts:
            return []
        cols = [np.concatenate(c) for c in zip(*self.parts, strict=True)]
        order = np.argsort(-cols[0], kind="stable")
        return list(zip(*(c[order].tolist() for c in cols), strict=True))


def _finish(
    context: str,
    qas_id: str,
    features: Sequence[Feature],
    candidates: _Candidates,
    null_logit: float,
    null_log_prob: float | None,
    n_best: int,
    deciding: Deciding,
) -> Prediction:
    """Rank the candidates into a Prediction (n-best, probabilities), then decide answerability."""
    entries: list[NBestEntry] = []
    seen: set[tuple[int, int]] = set()
    for score, slp, elp, w, s, e in candidates.ranked():
        if len(entries) >= n_best:
            break
        text, a, b = span_text(context, features[w].token_to_char, s, e)
        if not text or (a, b) in seen:  # whitespace-only spans say nothing; equal spans count once
            continue
        seen.add((a, b))
        entries.append(NBestEntry(text, a, b, score, 0.0, slp, elp, w, s, e))
    if entries:
        scores = np.array([x.score for x in entries])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        for x, p in zip(entries, probs, strict=True):
            x.probability = float(p)
    undecided = Prediction(
        qas_id=qas_id,
        text="",
        start=-1,
        end=-1,
        score=entries[0].score if entries else float("-inf"),
        no_answer_prob=1.0,
        null_logit=null_logit,
        is_impossible=True,
        n_best=entries,
        null_log_prob=null_log_prob,
    )
    return undecided.redecided(deciding, context)


def decode(
    example_or_context: SquadExample | str,
    features: Sequence[Feature],
    start_logits: ArrayLike,
    end_logits: ArrayLike,
    cls_logits: ArrayLike,
    *,
    n_best: int = DEFAULTS.n_best,
    max_answer_len: int = DEFAULTS.max_answer_len,
    threshold: float | None = None,
    answerability: Answerability | None = None,
    question: str | None = None,
    context_index: ContextIndex | None = None,
) -> Prediction:
    """Decode one question from the outputs of its windows (shallow head).

    ``features`` are this question's windows; ``start_logits``/``end_logits`` are ``[W, T]`` (T >=
    each window's length, e.g. a padded batch) or a list of W per-window arrays; ``cls_logits`` is
    ``[W]``. Per window, log-softmax over the positions with p_mask 0, keep the ``n_best`` best
    starts (paragraph tokens in their max-context window) and ends (paragraph tokens), and pair them.
    ``answerability`` (with the ``question``'s text) decides whether to answer; ``threshold`` (on the
    no-answer probability) overrides its rule.
    """
    context, qas_id = _context_and_id(example_or_context)
    if not features:
        raise ValueError("decode: no features")
    cls = np.asarray(cls_logits, dtype=np.float64).reshape(-1)
    if cls.shape[0] != len(features):
        raise ValueError(f"decode: {cls.shape[0]} cls_logits for {len(features)} features")
    candidates = _Candidates()
    null_log_prob = -np.inf
    for w, f in enumerate(features):
        length = len(f.input_ids)
        slp = _masked_log_softmax(_row(start_logits, w, length), f.p_mask)
        elp = _masked_log_softmax(_row(end_logits, w, length), f.p_mask)
        null_log_prob = max(null_log_prob, float(slp[f.cls_index] + elp[f.cls_index]))
        starts = _top(np.flatnonzero(f.token_is_max_context[: f.paragraph_len]), slp, n_best)
        ends = _top(np.arange(f.paragraph_len), elp, n_best)
        s, e = starts[:, None], ends[None, :]
        ok = (e >= s) & (e - s < max_answer_len)
        s, e = np.broadcast_to(s, ok.shape)[ok], np.broadcast_to(e, ok.shape)[ok]
        candidates.add(w, slp[s], elp[e], s, e)
    deciding = _deciding(example_or_context, question, threshold, answerability, context_index)
    return _finish(context, qas_id, features, candidates, float(cls.min()), null_log_prob, n_best, deciding)


def decode_beam(
    example_or_context: SquadExample | str,
    features: Sequence[Feature],
    start_top_log_probs: ArrayLike,
    start_top_index: ArrayLike,
    end_top_log_probs: ArrayLike,
    end_top_index: ArrayLike,
    cls_logits: ArrayLike,
    *,
    n_best: int = DEFAULTS.n_best,
    max_answer_len: int = DEFAULTS.max_answer_len,
    threshold: float | None = None,
    answerability: Answerability | None = None,
    question: str | None = None,
    context_index: ContextIndex | None = None,
) -> Prediction:
    """Decode one question from the XLNet beam head's outputs (the original ``write_predictions``).

    Per window: ``start_top_*`` are ``[k1]`` (log-prob, position); ``end_top_*`` are ``[k1 * k2]``
    flattened start-major (entry ``i * k2 + j`` is the j-th end for the i-th start, as in the
    original TF head) or ``[k1, k2]``. Positions index the (right-padded) feature. Unlike the
    original, a span may end on the last paragraph token (the original's ``>= paragraph_len - 1``
    test is an off-by-one), and spans with equal character offsets are listed once.
    """
    context, qas_id = _context_and_id(example_or_context)
    if not features:
        raise ValueError("decode_beam: no features")
    cls = np.asarray(cls_logits, dtype=np.float64).reshape(-1)
    if cls.shape[0] != len(features):
        raise ValueError(f"decode_beam: {cls.shape[0]} cls_logits for {len(features)} features")
    candidates = _Candidates()
    for w, f in enumerate(features):
        s_lp = np.asarray(start_top_log_probs[w], dtype=np.float64).reshape(-1)
        s_ix = np.asarray(start_top_index[w], dtype=np.int64).reshape(-1)
        k1 = s_lp.shape[0]
        e_lp = np.asarray(end_top_log_probs[w], dtype=np.float64).reshape(k1, -1)
        e_ix = np.asarray(end_top_index[w], dtype=np.int64).reshape(k1, -1)
        s = np.broadcast_to(s_ix[:, None], e_ix.shape)
        slp = np.broadcast_to(s_lp[:, None], e_lp.shape)
        in_para = (s >= 0) & (s < f.paragraph_len) & (e_ix >= 0) & (e_ix < f.paragraph_len)
        ok = in_para & (e_ix >= s) & (e_ix - s + 1 <= max_answer_len)
        ok[ok] = f.token_is_max_context[s[ok]]
        candidates.add(w, slp[ok], e_lp[ok], s[ok], e_ix[ok])
    deciding = _deciding(example_or_context, question, threshold, answerability, context_index)
    return _finish(context, qas_id, features, candidates, float(cls.min()), None, n_best, deciding)


def _deciding(
    example_or_context: SquadExample | str,
    question: str | None,
    threshold: float | None,
    answerability: Answerability | None,
    index: ContextIndex | None,
) -> Deciding:
    if question is None:
        question = example_or_context.question if isinstance(example_or_context, SquadExample) else ""
    return Deciding(answerability, question, threshold, index)


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
    **kwargs: Any,
) -> dict[str, Prediction]:
    """Decode every example from flat per-feature outputs (row i belongs to ``features[i]``).

    Rows may be a ``[F, T]`` array or a list of F arrays of any lengths >= their feature's (so
    batches padded to different lengths can simply be concatenated as lists). Keyword arguments go
    to :func:`decode`. Returns qas_id -> Prediction for the examples that have features.
    """
    cls = np.asarray(cls_logits, dtype=np.float64).reshape(-1)
    outputs = {"start_logits": start_logits, "end_logits": end_logits, "cls_logits": cls}
    return decode_all_head_outputs("shallow", examples, features, outputs, **kwargs)


def decode_all_beam(
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    start_top_log_probs: ArrayLike,
    start_top_index: ArrayLike,
    end_top_log_probs: ArrayLike,
    end_top_index: ArrayLike,
    cls_logits: ArrayLike,
    **kwargs: Any,
) -> dict[str, Prediction]:
    """:func:`decode_all` for the beam head's flat per-feature outputs."""
    outputs = {
        "start_top_log_probs": start_top_log_probs,
        "start_top_index": start_top_index,
        "end_top_log_probs": end_top_log_probs,
        "end_top_index": end_top_index,
        "cls_logits": np.asarray(cls_logits, dtype=np.float64).reshape(-1),
    }
    return decode_all_head_outputs("beam", examples, features, outputs, **kwargs)


def answers_and_na_probs(
    predictions: Mapping[str, Prediction], apply_threshold: bool = False
) -> tuple[dict[str, str], dict[str, float]]:
    """``(answers, na_probs)`` for :func:`train.squad.metrics.evaluate`.

    By default the answers are the best spans (never ""), as the original XLNet writes them, and the
    no-answer decision is left to ``evaluate(..., na_probs, na_prob_thresh=t)``, which then reports
    the score at ``t`` and the best threshold. ``apply_threshold=True`` gives the decided answers.
    """
    answers = {q: (p.text if apply_threshold else p.best_span_text) for q, p in predictions.items()}
    return answers, {q: p.no_answer_prob for q, p in predictions.items()}


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
    *,
    n_best: int = DEFAULTS.n_best,
    max_answer_len: int = DEFAULTS.max_answer_len,
    threshold: float | None = None,
    answerability: Answerability | None = None,
    question: str | None = None,
    context_index: ContextIndex | None = None,
) -> Prediction:
    """Decode one question from its windows' named model outputs (``rows[w][name]``, the names of
    ``train.common.contract.OUTPUT_NAMES[head]``), whatever the head: the one switch from a head's outputs to
    an answer, used by evaluation, the export's agreement check and the server."""
    if head not in OUTPUT_NAMES:
        raise ValueError(f"unknown head {head!r}; expected one of {sorted(OUTPUT_NAMES)}")
    kw: dict[str, Any] = {"n_best": n_best, "max_answer_len": max_answer_len, "threshold": threshold}
    kw |= {"answerability": answerability, "question": question, "context_index": context_index}
    if head == "beam":
        cls = np.array([float(r["cls_logits"]) for r in rows])
        return decode_beam(
            example_or_context,
            features,
            [r["start_top_log_probs"] for r in rows],
            [r["start_top_index"] for r in rows],
            [r["end_top_log_probs"] for r in rows],
            [r["end_top_index"] for r in rows],
            cls,
            **kw,
        )
    starts = [r["start_logits"] for r in rows]
    ends = [r["end_logits"] for r in rows]
    if head == "simple":  # no answerability output: the null span's score stands in for it
        cls = np.array([simple_null_logit(s, e, f) for s, e, f in zip(starts, ends, features, strict=True)])
    else:
        cls = np.array([float(r["cls_logits"]) for r in rows])
    return decode(example_or_context, features, starts, ends, cls, **kw)


def decode_all_head_outputs(
    head: str,
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    outputs: Mapping[str, ArrayLike],
    **kwargs: Any,
) -> dict[str, Prediction]:
    """:func:`decode_head_outputs` for every example, from flat per-feature outputs by name
    (``outputs[name][i]`` belongs to ``features[i]``). Returns qas_id -> Prediction. Questions about
    one context share its :class:`ContextIndex` when a verifier needs one."""
    out: dict[str, Prediction] = {}
    answerability: Answerability | None = kwargs.get("answerability")
    indexes: dict[str, ContextIndex] = {}
    for ex_i, idx in group_features(features).items():
        ex = examples[ex_i]
        rows = [{name: values[i] for name, values in outputs.items()} for i in idx]
        if answerability is not None and answerability.uses_lexical:
            if ex.context not in indexes:
                indexes[ex.context] = ContextIndex(ex.context)
            kwargs["context_index"] = indexes[ex.context]
        out[ex.qas_id] = decode_head_outputs(head, ex, [features[i] for i in idx], rows, **kwargs)
    return out
