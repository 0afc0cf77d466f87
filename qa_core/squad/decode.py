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

Whether to answer is decided by :mod:`qa_core.squad.answerability` from the model's scores (the
minimum over windows of ``cls_logit``, the logit that the question is unanswerable: a window that
does not hold the answer *should* call the question unanswerable from what it sees, so only the most
confident "answerable" window carries evidence; the null span's log-probability; the best span's)
and, when the model carries a fitted verifier, lexical evidence about the question and the best
span's sentence. Without one, the no-answer probability is ``sigmoid(min cls_logit)`` against the
threshold (0.5 by default), as in the original. A question judged unanswerable gets text "" but its
n-best list keeps the spans, so the decision can be revisited later (:func:`answers_and_na_probs`).

What a decoder returns is in :mod:`.prediction`; decoding a head's named outputs, or a whole set of
questions, is in :mod:`.head_outputs`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from qa_core.contract import DEFAULTS, ModelSettings, positive_int, probability

from .alignment import cuts_a_word, trimmed, word_extent
from .answerability import Answerability
from .answerability_features import ContextIndex
from .candidates import TOP_K
from .data import SquadExample
from .features import Feature
from .prediction import Deciding, NBestEntry, Prediction

ArrayLike = np.ndarray | Sequence[float] | Sequence[np.ndarray]

_MASKED = -1e30


@dataclass(frozen=True)
class DecodeOptions:
    """What turns every question's window outputs into its answer in one decoding call: the spans it
    keeps and how long they may be (``settings``' ``n_best`` and ``max_answer_len``: the model's, or a
    call's own), and the decision (``answerability``, the model's fitted rule; ``threshold`` on the
    no-answer probability replaces it). One value, so that evaluation, the export's agreement check and
    the server cannot pass different subsets."""

    settings: ModelSettings = DEFAULTS
    threshold: float | None = None
    answerability: Answerability | None = None

    def __post_init__(self) -> None:
        for name in ("n_best", "max_answer_len"):
            if not positive_int(getattr(self.settings, name)):
                raise ValueError(f"{name} must be a whole number >= 1, got {getattr(self.settings, name)!r}")
        if self.threshold is not None and not probability(self.threshold):
            raise ValueError(f"threshold must be a probability in [0, 1], got {self.threshold!r}")

    @property
    def n_best(self) -> int:
        return self.settings.n_best

    @property
    def max_answer_len(self) -> int:
        return self.settings.max_answer_len

    @classmethod
    def of(
        cls,
        settings: ModelSettings,
        answerability: Answerability | None = None,
        threshold: float | None = None,
    ) -> DecodeOptions:
        """A model's own decoding (its recorded n-best and longest span) with a decision rule."""
        return cls(settings, threshold, answerability)

    @classmethod
    def spans(
        cls,
        n_best: int = DEFAULTS.n_best,
        max_answer_len: int = DEFAULTS.max_answer_len,
        threshold: float | None = None,
        answerability: Answerability | None = None,
    ) -> DecodeOptions:
        """Decoding with these spans (a call's own n-best and longest span, the rest the defaults')."""
        return cls(replace(DEFAULTS, n_best=n_best, max_answer_len=max_answer_len), threshold, answerability)


DEFAULT_DECODING = DecodeOptions()


def _masked_log_softmax(logits: np.ndarray, p_mask: np.ndarray) -> np.ndarray:
    """log-softmax of each row over positions with p_mask == 0 (paragraph and <cls>), as the original
    head; the start and end rows of a window in one call."""
    x = np.where(p_mask.astype(bool), _MASKED, np.asarray(logits, dtype=np.float64))  # no copy of float64
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def _start_end(start_logits: ArrayLike, end_logits: ArrayLike, i: int, length: int) -> np.ndarray:
    """Feature ``i``'s start and end rows (each of a [F, T] array or a list of per-feature arrays), cut
    to its length, as one [2, length] float64 array (converted in one step, only the positions read)."""
    rows = []
    for values in (start_logits, end_logits):
        row = np.asarray(values[i]).reshape(-1)
        if row.shape[0] < length:
            raise ValueError(
                f"logits for feature {i} have {row.shape[0]} positions, the feature has {length}"
            )
        rows.append(row[:length])
    return np.array(rows, dtype=np.float64)


SPARE_SPANS = 16  # spans kept per window beyond n_best, for those that repeat another's text or are blank


def _window_max(values: np.ndarray, width: int) -> np.ndarray:
    """``out[i] = max(values[i : i + width])`` for every full window, by doubling: log2(width) maxima
    of whole arrays, not one per position."""
    span, m = 1, values
    while 2 * span <= width:
        m = np.maximum(m[:-span], m[span:])
        span *= 2
    return np.maximum(m[: len(values) - width + 1], m[width - span :]) if span < width else m


def _best_spans(
    slp: np.ndarray, elp: np.ndarray, f: Feature, max_answer_len: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best valid spans of one window, exactly: every start in the paragraph whose max-context
    window this is, with every end from it to ``max_answer_len`` tokens on, best first. Exact, so the
    first spans do not depend on how many are asked for (``n_best``): a pool of 10 and one of 100 begin
    alike. Each start's best span is its log-probability plus the best end within reach (a sliding
    maximum); the k-th best of those bounds the k-th best span, so only starts at or above it are
    expanded into their [L] ends (about k rows, not the paragraph's)."""
    n = f.paragraph_len
    length = min(max_answer_len, n)
    if length < 1:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    padded = np.full(n + length - 1, -np.inf)
    padded[:n] = elp[:n]
    start_lp = np.where(np.asarray(f.token_is_max_context[:n], dtype=bool), slp[:n], -np.inf)
    rows = np.arange(n)
    if n > k:  # a start whose best span is below the k-th best start's holds none of the k best spans,
        best_of_row = start_lp + _window_max(padded, length)  # and each of the k best starts holds one
        bound = np.partition(best_of_row, n - k)[n - k]  # at or above it: the k best spans all reach it
        rows = np.flatnonzero(best_of_row >= bound)
        flat = (start_lp[rows, None] + padded[rows[:, None] + np.arange(length)]).ravel()
        best = np.flatnonzero(flat >= bound)  # a few dozen, sorted here (a selection costs more)
    else:
        flat = (start_lp[:, None] + padded[rows[:, None] + np.arange(length)]).ravel()
        best = np.arange(flat.size)
    best = best[np.argsort(-flat[best], kind="stable")[:k]]  # equals in (start, end) order
    best = best[np.isfinite(flat[best])]
    starts = rows[best // length]
    return starts, starts + best % length


def _context_and_id(example_or_context: SquadExample | str) -> tuple[str, str]:
    if isinstance(example_or_context, SquadExample):
        return example_or_context.context, example_or_context.qas_id
    return example_or_context, ""


class _Candidates:
    """Valid spans of all windows as parallel arrays (ranked once, turned into text lazily), with their
    characters in the context (untrimmed), gathered per window in one step."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(
        self,
        window: int,
        feature: Feature,
        start_lp: np.ndarray,
        end_lp: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
    ) -> None:
        if start.size:
            chars = feature.token_to_char
            self.parts.append(
                (
                    start_lp + end_lp,
                    start_lp,
                    end_lp,
                    np.full(start.size, window),
                    start,
                    end,
                    chars[start, 0],
                    chars[end, 1],
                )
            )

    def ranked(self) -> Iterator[tuple[float, float, float, int, int, int, int, int]]:
        """``(score, start_lp, end_lp, window, start_tok, end_tok, start_char, end_char)``, best score
        first (stable), made as they are read: a decode reads a few dozen of the hundreds of candidates."""
        if not self.parts:
            return
        cols: Sequence[np.ndarray] = (
            self.parts[0]
            if len(self.parts) == 1
            else [np.concatenate(c) for c in zip(*self.parts, strict=True)]
        )
        # one window's exact best spans (most questions) come best first already: the stable sort is
        # the identity there, so it is skipped
        order = None if np.all(cols[0][1:] <= cols[0][:-1]) else np.argsort(-cols[0], kind="stable")
        step = 32
        for lo in range(0, len(cols[0]), step):
            rows = slice(lo, lo + step) if order is None else order[lo : lo + step]
            yield from zip(*(c[rows].tolist() for c in cols), strict=True)


def _finish(
    context: str,
    qas_id: str,
    features: Sequence[Feature],
    candidates: _Candidates,
    null_logit: float,
    null_log_prob: float | None,
    options: DecodeOptions,
    deciding: Deciding,
) -> Prediction:
    """Rank the candidates into a Prediction (n-best, probabilities, each span's whole-word extent
    within ``max_answer_len`` tokens), then decide answerability."""
    n_best = options.n_best
    entries: list[NBestEntry] = []
    seen: set[tuple[int, int]] = set()
    for score, slp, elp, w, s, e, a, b in candidates.ranked():
        if len(entries) >= n_best:
            break
        text = context[a:b]
        whole = bool(text) and not text[0].isspace() and not text[-1].isspace()
        if not whole:  # rare: trim as span_text does
            text, a, b = trimmed(context, a, b)
        if not text or (a, b) in seen:  # whitespace-only spans say nothing; equal spans count once
            continue
        seen.add((a, b))
        if whole and not cuts_a_word(context, a, b):  # its tokens' own characters: whole words already
            wa, wb = a, b
        else:
            f = features[w]
            wa, wb = word_extent(
                context, f.token_to_char, s, e, 0, f.paragraph_len - 1, options.max_answer_len
            )
            if not whole:  # from the tokens' characters: trimmed as the span was
                _, wa, wb = trimmed(context, wa, wb)
        entries.append(NBestEntry(text, a, b, score, 0.0, slp, elp, w, s, e, wa, wb))
    if entries:
        scores = np.array([x.score for x in entries])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        weights = np.exp(scores - scores[0])  # entries are best first
        shares = weights / weights[:TOP_K].sum()
        for x, p, share in zip(entries, probs.tolist(), shares.tolist(), strict=True):
            x.probability, x.share = p, share
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
    options: DecodeOptions = DEFAULT_DECODING,
    *,
    question: str | None = None,
    context_index: ContextIndex | None = None,
) -> Prediction:
    """Decode one question from the outputs of its windows (shallow head).

    ``features`` are this question's windows; ``start_logits``/``end_logits`` are ``[W, T]`` (T >=
    each window's length, e.g. a padded batch) or a list of W per-window arrays; ``cls_logits`` is
    ``[W]``. Per window, log-softmax over the positions with p_mask 0, then the window's best spans,
    exactly (starts: paragraph tokens in their max-context window; ends: paragraph tokens at most
    ``max_answer_len`` on), ranked over all windows into the ``options.n_best`` list. ``options``
    decide whether to answer (with the ``question``'s text for a verifier).
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
        slp, elp = _masked_log_softmax(_start_end(start_logits, end_logits, w, length), f.p_mask)
        null_log_prob = max(null_log_prob, float(slp[f.cls_index] + elp[f.cls_index]))
        s, e = _best_spans(slp, elp, f, options.max_answer_len, options.n_best + SPARE_SPANS)
        candidates.add(w, f, slp[s], elp[e], s, e)
    deciding = _deciding(example_or_context, question, options, context_index)
    return _finish(context, qas_id, features, candidates, float(cls.min()), null_log_prob, options, deciding)


def decode_beam(
    example_or_context: SquadExample | str,
    features: Sequence[Feature],
    start_top_log_probs: ArrayLike,
    start_top_index: ArrayLike,
    end_top_log_probs: ArrayLike,
    end_top_index: ArrayLike,
    cls_logits: ArrayLike,
    options: DecodeOptions = DEFAULT_DECODING,
    *,
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
        ok = in_para & (e_ix >= s) & (e_ix - s + 1 <= options.max_answer_len)
        ok[ok] = f.token_is_max_context[s[ok]]
        candidates.add(w, f, slp[ok], e_lp[ok], s[ok], e_ix[ok])
    deciding = _deciding(example_or_context, question, options, context_index)
    return _finish(context, qas_id, features, candidates, float(cls.min()), None, options, deciding)


def _deciding(
    example_or_context: SquadExample | str,
    question: str | None,
    options: DecodeOptions,
    index: ContextIndex | None,
) -> Deciding:
    if question is None:
        question = example_or_context.question if isinstance(example_or_context, SquadExample) else ""
    return Deciding(options.answerability, question, options.threshold, index)
