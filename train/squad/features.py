"""SQuAD examples -> model inputs, following the original XLNet ``run_squad.py`` (not BERT's).

Layout of one window (XLNet puts the longer segment first, as in pretraining, and ``<cls>`` last)::

    tokens    P_0 ... P_{n-1} <sep> Q_0 ... Q_{m-1} <sep> <cls>
    segments  0   ...   0      0    1   ...   1     1     2        (padding: 3)
    p_mask    0   ...   0      1    1   ...   1     1     0        (padding: 1)

``p_mask`` is 1 where the answer may NOT start or end; ``<cls>`` is 0 because it is the "no answer"
position. The question is cut to ``max_query_len`` tokens; a paragraph longer than the room left
(``max_seq_len - len(Q) - 3``) is split into windows that advance by ``doc_stride`` tokens, and each
paragraph token is scored in every window holding it (min(left, right) context + 0.01 * window
length); the best window (the first one on ties) is its "max context" window, the only one in which
decoding lets a span start there.

Features are not padded: :func:`pad_batch` pads a micro-batch to its longest feature (right
padding, so token positions and ``cls_index`` are the same with and without padding). Character
offsets come from the tokenizer, so nothing here is quadratic in the context length.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from train.common.contract import CLS_ID, DEFAULTS, PAD_ID, SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD, SEP_ID

from .data import SquadExample

logger = logging.getLogger(__name__)

_NO_CHAR = -1


class TokenizerLike(Protocol):
    """What featurisation needs from :class:`train.tokenizer.XLNetTokenizer`."""

    def encode(self, text: str) -> list[int]: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...


@dataclass(eq=False)
class Feature:
    """One window of one example, unpadded. Arrays have the feature's length L.

    ``token_to_char[i]`` is the ``(start, end)`` character span in the context of paragraph token
    ``i`` and ``(-1, -1)`` for every other token; ``token_is_max_context[i]`` is True only for
    paragraph tokens whose max-context window is this one. Paragraph token ``i`` of this window is
    token ``paragraph_start + i`` of the whole tokenised paragraph. ``start_position`` and
    ``end_position`` (inclusive) are set with ``is_training=True``: the answer's tokens, or
    ``cls_index`` when the question is unanswerable or the answer is not wholly inside the window.
    """

    example_index: int
    window_index: int
    qas_id: str
    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    p_mask: np.ndarray
    cls_index: int
    token_to_char: np.ndarray
    token_is_max_context: np.ndarray
    paragraph_start: int
    paragraph_len: int
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class AlignmentFailure:
    """An answer whose tokens do not map back to exactly its text."""

    qas_id: str
    answer_text: str
    answer_start: int
    recovered_text: str | None


def offsets_array(offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """Tokenizer offsets as an int64 array of shape [n, 2] (also for n == 0).

    ``np.fromiter`` over the flattened pairs is ~3x faster than ``np.asarray`` on a list of tuples,
    which matters on the per-request serving path.
    """
    if isinstance(offsets, np.ndarray):
        return offsets.astype(np.int64, copy=False).reshape(-1, 2)
    flat = itertools.chain.from_iterable(offsets)
    return np.fromiter(flat, dtype=np.int64, count=2 * len(offsets)).reshape(-1, 2)


def align_answer(offsets: np.ndarray, answer_start: int, answer_text: str) -> tuple[int, int] | None:
    """Inclusive token span of an answer: every token whose characters overlap the answer's.

    Leading/trailing whitespace of the answer is ignored, and so are zero-width tokens. None when no
    token overlaps (a whitespace-only answer).
    """
    stripped = answer_text.lstrip()
    a = answer_start + (len(answer_text) - len(stripped))
    b = a + len(stripped.rstrip())
    if b <= a or len(offsets) == 0:
        return None
    starts, ends = offsets[:, 0], offsets[:, 1]
    hit = np.flatnonzero((starts < b) & (ends > a) & (ends > starts))
    if hit.size == 0:
        return None
    return int(hit[0]), int(hit[-1])


def span_text(context: str, token_to_char: np.ndarray, start: int, end: int) -> tuple[str, int, int]:
    """``(text, char_start, char_end)`` of tokens ``start..end``, whitespace trimmed, so that
    ``context[char_start:char_end] == text``."""
    a, b = int(token_to_char[start, 0]), int(token_to_char[end, 1])
    raw = context[a:b]
    a += len(raw) - len(raw.lstrip())
    b = max(a, b - (len(raw) - len(raw.rstrip())))
    return context[a:b], a, b


def _window_starts(n_tokens: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each window, exactly as the original: advance by min(length, stride)."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < n_tokens:
        length = min(n_tokens - start, room)
        spans.append((start, length))
        if start + length == n_tokens:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]


def _max_context_windows(n_tokens: int, spans: list[tuple[int, int]]) -> np.ndarray:
    """For each paragraph token, the index of its max-context window (first one on ties); linear time."""
    if len(spans) == 1:
        return np.zeros(n_tokens, dtype=np.int64)
    best_score = np.full(n_tokens, -np.inf)
    best_window = np.zeros(n_tokens, dtype=np.int64)
    for w, (start, length) in enumerate(spans):
        if length == 0:
            continue
        pos = np.arange(length)
        score = np.minimum(pos, length - 1 - pos) + 0.01 * length
        cur = best_score[start : start + length]
        better = score > cur
        cur[better] = score[better]
        best_window[start : start + length][better] = w
    return best_window


class _Encoder:
    """Tokenizer calls cached per text, so a paragraph shared by many questions is encoded once."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self.tokenizer = tokenizer
        self._contexts: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def context(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        hit = self._contexts.get(text)
        if hit is None:
            ids, offsets = self.tokenizer.encode_with_offsets(text)
            hit = (np.asarray(ids, dtype=np.int64), offsets_array(offsets))
            self._contexts[text] = hit
        return hit


def _check_lengths(max_seq_len: int, doc_stride: int, max_query_len: int) -> None:
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be >= 1, got {doc_stride}")
    if max_query_len < 1:
        raise ValueError(f"max_query_len must be >= 1, got {max_query_len}")
    if max_seq_len < max_query_len + 4:
        raise ValueError(
            f"max_seq_len={max_seq_len} leaves no room for the paragraph with max_query_len={max_query_len} "
            "(needs max_seq_len >= max_query_len + 4)"
        )


def _featurize_example(
    example_index: int,
    qas_id: str,
    question: str,
    ctx_ids: np.ndarray,
    offsets: np.ndarray,
    tokenizer: TokenizerLike,
    max_seq_len: int,
    doc_stride: int,
    max_query_len: int,
    label: tuple[int, int] | None | Literal[False],
    label_is_plausible: bool = False,
) -> list[Feature]:
    """Windows of one question/paragraph. ``label``: False = no labels, None = unanswerable,
    else the answer's inclusive token span in the whole paragraph; with ``label_is_plausible`` that
    span is an unanswerable question's plausible answer: windows holding it point at it, but every
    window stays labelled unanswerable."""
    q_ids = tokenizer.encode(question)[:max_query_len]
    n_q = len(q_ids)
    room = max_seq_len - n_q - 3
    n_tokens = len(ctx_ids)
    spans = _window_starts(n_tokens, room, doc_stride)
    best_window = _max_context_windows(n_tokens, spans)

    # The part after the paragraph is the same for every window.
    tail_ids = np.array([SEP_ID, *q_ids, SEP_ID, CLS_ID], dtype=np.int64)
    tail_types = np.full(n_q + 3, SEG_ID_B, dtype=np.int64)
    tail_types[0] = SEG_ID_A
    tail_types[-1] = SEG_ID_CLS
    tail_p_mask = np.ones(n_q + 3, dtype=np.int64)
    tail_p_mask[-1] = 0
    tail_chars = np.full((n_q + 3, 2), _NO_CHAR, dtype=np.int64)
    tail_max_ctx = np.zeros(n_q + 3, dtype=bool)

    features: list[Feature] = []
    for w, (start, length) in enumerate(spans):
        end = start + length
        total = length + n_q + 3
        cls_index = total - 1
        token_types = np.concatenate([np.full(length, SEG_ID_A, dtype=np.int64), tail_types])
        p_mask = np.concatenate([np.zeros(length, dtype=np.int64), tail_p_mask])
        feature = Feature(
            example_index=example_index,
            window_index=w,
            qas_id=qas_id,
            input_ids=np.concatenate([ctx_ids[start:end], tail_ids]),
            attention_mask=np.ones(total, dtype=np.int64),
            token_type_ids=token_types,
            p_mask=p_mask,
            cls_index=cls_index,
            token_to_char=np.concatenate([offsets[start:end], tail_chars]),
            token_is_max_context=np.concatenate([best_window[start:end] == w, tail_max_ctx]),
            paragraph_start=start,
            paragraph_len=length,
        )
        if label is not False:
            if label is None or not (start <= label[0] and label[1] < end):
                feature.start_position = feature.end_position = cls_index
                feature.is_impossible = True
            else:
                feature.start_position = label[0] - start
                feature.end_position = label[1] - start
                feature.is_impossible = label_is_plausible
        features.append(feature)
    return features


def featurize(
    examples: Iterable[SquadExample],
    tokenizer: TokenizerLike,
    max_seq_len: int = DEFAULTS.max_seq_len,
    doc_stride: int = DEFAULTS.doc_stride,
    max_query_len: int = DEFAULTS.max_query_len,
    is_training: bool = False,
    plausible_spans: bool = False,
) -> list[Feature]:
    """All windows of all examples, in order; ``Feature.example_index`` indexes ``examples``.

    With ``is_training`` the features carry labels from each example's first answer; an answer that
    no token overlaps (whitespace only) cannot be labelled, and its example is skipped with a
    warning, as the original skipped answers it could not find. Without it, ``is_impossible`` is the
    example's own flag and the positions are None.

    ``plausible_spans`` (training only; Read+Verify's auxiliary span targets): an unanswerable
    question with ``plausible_answers`` gets its first plausible answer as the span target of the
    windows that hold it, while its answerability label stays "unanswerable", so the span head learns
    where the question points and the answerability head learns that it is not answered there.
    """
    _check_lengths(max_seq_len, doc_stride, max_query_len)
    encoder = _Encoder(tokenizer)
    features: list[Feature] = []
    skipped = 0
    for i, ex in enumerate(examples):
        ctx_ids, offsets = encoder.context(ex.context)
        label: tuple[int, int] | None | Literal[False] = False
        plausible = False
        if is_training:
            answer = ex.first_answer
            if (ex.is_impossible or answer is None) and plausible_spans and ex.plausible_answers:
                text, at = ex.plausible_answers[0]
                label = align_answer(offsets, at, text)  # None (plain unanswerable) if it cannot align
                plausible = label is not None
            elif ex.is_impossible or answer is None:
                label = None
            else:
                label = align_answer(offsets, answer[1], answer[0])
                if label is None:
                    skipped += 1
                    continue
        feats = _featurize_example(
            i,
            ex.qas_id,
            ex.question,
            ctx_ids,
            offsets,
            tokenizer,
            max_seq_len,
            doc_stride,
            max_query_len,
            label,
            plausible,
        )
        if not is_training:
            for f in feats:
                f.is_impossible = ex.is_impossible
        features.extend(feats)
    if skipped:
        logger.warning("featurize: skipped %d training examples whose answer no token overlaps", skipped)
    return features


def subsample_out_of_window(
    features: Sequence[Feature], examples: Sequence[SquadExample], keep: float, seed: int = 0
) -> list[Feature]:
    """Training windows with `keep` (0..1) of the out-of-window ones: windows of an answerable question
    that do not hold its answer (labelled `<cls>`, like an unanswerable question). Windows holding
    the answer and every window of an unanswerable question stay. Long contexts with short windows
    make most training windows out-of-window; the original keeps them all (keep=1).
    """
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must be in [0, 1], got {keep}")
    if keep == 1.0:
        return list(features)
    rng = np.random.default_rng(seed)
    draws = rng.random(len(features))
    return [
        f
        for f, u in zip(features, draws, strict=True)
        if not f.is_impossible or not examples[f.example_index].answers or u < keep
    ]


def featurize_one(
    question: str,
    context: str,
    tokenizer: TokenizerLike,
    max_seq_len: int = DEFAULTS.max_seq_len,
    doc_stride: int = DEFAULTS.doc_stride,
    max_query_len: int = DEFAULTS.max_query_len,
) -> list[Feature]:
    """The windows of a single (question, context) pair, without labels: the serving path.

    An empty context still gives one window (``<sep> Q <sep> <cls>``) so the model can answer "no".
    """
    ids, offsets = tokenizer.encode_with_offsets(context)
    return featurize_encoded(question, ids, offsets, tokenizer, max_seq_len, doc_stride, max_query_len)


def featurize_encoded(
    question: str,
    context_ids: Sequence[int],
    context_offsets: Sequence[tuple[int, int]],
    tokenizer: TokenizerLike,
    max_seq_len: int = DEFAULTS.max_seq_len,
    doc_stride: int = DEFAULTS.doc_stride,
    max_query_len: int = DEFAULTS.max_query_len,
) -> list[Feature]:
    """``featurize_one`` for a context already encoded (``tokenizer.encode_with_offsets``), so a caller
    can look at the token count before any window is built."""
    _check_lengths(max_seq_len, doc_stride, max_query_len)
    return _featurize_example(
        0,
        "",
        question,
        np.asarray(context_ids, dtype=np.int64),
        offsets_array(context_offsets),
        tokenizer,
        max_seq_len,
        doc_stride,
        max_query_len,
        False,
    )


def pad_batch(
    features: Sequence[Feature],
    pad_to: int | None = None,
    multiple_of: int | None = None,
    include_labels: bool = False,
    max_length: int | None = None,
) -> dict[str, np.ndarray]:
    """Right-pad features into int64 arrays ``[B, T]``: input_ids, attention_mask, token_type_ids, p_mask.

    T is the longest feature, or ``pad_to`` (which must fit them all), rounded up to a multiple of
    ``multiple_of`` (e.g. 8 for tensor cores, or to limit the number of distinct shapes an engine
    sees) but never past ``max_length`` (the longest input the model or engine takes). Padding is PAD_ID / 0 / SEG_ID_PAD / 1. ``include_labels`` adds ``[B]`` arrays cls_index,
    start_positions, end_positions and is_impossible for training (labelled features only).
    """
    if not features:
        raise ValueError("pad_batch: no features")
    longest = max(len(f.input_ids) for f in features)
    length = longest if pad_to is None else pad_to
    if length < longest:
        raise ValueError(f"pad_batch: pad_to={pad_to} is shorter than the longest feature ({longest})")
    if multiple_of:
        rounded = -(-length // multiple_of) * multiple_of
        length = rounded if max_length is None else max(length, min(rounded, max_length))
    n = len(features)
    batch = {
        "input_ids": np.full((n, length), PAD_ID, dtype=np.int64),
        "attention_mask": np.zeros((n, length), dtype=np.int64),
        "token_type_ids": np.full((n, length), SEG_ID_PAD, dtype=np.int64),
        "p_mask": np.ones((n, length), dtype=np.int64),
    }
    for i, f in enumerate(features):
        k = len(f.input_ids)
        batch["input_ids"][i, :k] = f.input_ids
        batch["attention_mask"][i, :k] = f.attention_mask
        batch["token_type_ids"][i, :k] = f.token_type_ids
        batch["p_mask"][i, :k] = f.p_mask
    if include_labels:
        if any(f.start_position is None or f.end_position is None for f in features):
            raise ValueError("pad_batch: include_labels needs features made with is_training=True")
        batch["cls_index"] = np.array([f.cls_index for f in features], dtype=np.int64)
        batch["start_positions"] = np.array([f.start_position for f in features], dtype=np.int64)
        batch["end_positions"] = np.array([f.end_position for f in features], dtype=np.int64)
        batch["is_impossible"] = np.array([f.is_impossible for f in features], dtype=np.int64)
    return batch


def feature_answer_text(feature: Feature, context: str) -> str | None:
    """The context text under a training feature's labelled span; None if it points at ``<cls>``."""
    if feature.start_position is None or feature.end_position is None or feature.is_impossible:
        return None
    return span_text(context, feature.token_to_char, feature.start_position, feature.end_position)[0]


def answer_survives(context: str, offsets: np.ndarray, answer_text: str, answer_start: int) -> bool:
    """Whether the answer's tokens map back to exactly its text (whitespace trimmed)."""
    span = align_answer(offsets, answer_start, answer_text)
    if span is None:
        return False
    return span_text(context, offsets, span[0], span[1])[0] == answer_text.strip()


def alignment_report(
    examples: Iterable[SquadExample], tokenizer: TokenizerLike
) -> tuple[int, int, list[AlignmentFailure]]:
    """``(n_ok, n_total, failures)`` over every distinct gold answer: text -> tokens -> text exactly."""
    encoder = _Encoder(tokenizer)
    n_ok = n_total = 0
    failures: list[AlignmentFailure] = []
    for ex in examples:
        if not ex.answers:
            continue
        _, offsets = encoder.context(ex.context)
        for text, start in dict.fromkeys(ex.answers):
            n_total += 1
            span = align_answer(offsets, start, text)
            recovered = None if span is None else span_text(ex.context, offsets, span[0], span[1])[0]
            if recovered == text.strip():
                n_ok += 1
            else:
                failures.append(AlignmentFailure(ex.qas_id, text, start, recovered))
    return n_ok, n_total, failures
