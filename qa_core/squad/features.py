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

Features are not padded: :func:`.batches.pad_batch` pads a micro-batch to its longest feature (right
padding, so token positions and ``cls_index`` are the same with and without padding). Character
offsets come from the tokenizer (:mod:`.alignment`), so nothing here is quadratic in the context length.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from qa_core.contract import (
    CLS_ID,
    DEFAULTS,
    SEG_ID_A,
    SEG_ID_B,
    SEG_ID_CLS,
    SEP_ID,
    ModelSettings,
    window_problems,
)

from .alignment import ContextEncoder, TokenizerLike, align_answer, offsets_array, span_text
from .data import SquadExample

logger = logging.getLogger(__name__)

_NO_CHAR = -1


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


def _check_lengths(max_seq_len: int, doc_stride: int, max_query_len: int) -> None:
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be >= 1, got {doc_stride}")
    if max_query_len < 1:
        raise ValueError(f"max_query_len must be >= 1, got {max_query_len}")
    if found := window_problems(max_seq_len, max_query_len):
        raise ValueError("; ".join(found))


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
    question_ids: Sequence[int] | None = None,
) -> list[Feature]:
    """Windows of one question/paragraph. ``label``: False = no labels, None = unanswerable,
    else the answer's inclusive token span in the whole paragraph; with ``label_is_plausible`` that
    span is an unanswerable question's plausible answer: windows holding it point at it, but every
    window stays labelled unanswerable. ``question_ids``: ``tokenizer.encode(question)`` when the
    caller has it already."""
    q_ids = list(tokenizer.encode(question) if question_ids is None else question_ids)[:max_query_len]
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


def featurize_with(
    examples: Iterable[SquadExample], tokenizer: TokenizerLike, settings: ModelSettings
) -> list[Feature]:
    """:func:`featurize` with a model's own windows (its :class:`ModelSettings`): what evaluation, an
    ensemble and the export's agreement check window questions with, as the model was trained."""
    return featurize(examples, tokenizer, settings.max_seq_len, settings.doc_stride, settings.max_query_len)


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
    encoder = ContextEncoder(tokenizer)
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
    context_ids: Sequence[int] | np.ndarray,
    context_offsets: Sequence[tuple[int, int]] | np.ndarray,
    tokenizer: TokenizerLike,
    max_seq_len: int = DEFAULTS.max_seq_len,
    doc_stride: int = DEFAULTS.doc_stride,
    max_query_len: int = DEFAULTS.max_query_len,
    question_ids: Sequence[int] | None = None,
) -> list[Feature]:
    """``featurize_one`` for a context already encoded (``tokenizer.encode_with_offsets``), so a caller
    can look at the token count before any window is built; ``question_ids`` likewise for the question
    (``tokenizer.encode(question)``). Offsets may be an ``[n, 2]`` int64 array (used as is)."""
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
        question_ids=question_ids,
    )


def feature_answer_text(feature: Feature, context: str) -> str | None:
    """The context text under a training feature's labelled span; None if it points at ``<cls>``."""
    if feature.start_position is None or feature.end_position is None or feature.is_impossible:
        return None
    return span_text(context, feature.token_to_char, feature.start_position, feature.end_position)[0]
