"""SQuAD features pinned against small reference re-implementations of the original XLNet: windows,
stride, layout, segment ids and labels as run_squad.py convert_examples_to_features makes them.

Each ``_orig_*`` function is a reference in numpy / plain Python: how they are written, and the list
of points with their tests, are in docs/recipe.md ("Points the review found matching").
"""

from __future__ import annotations

import numpy as np
import pytest
from paths import SAMPLE_DEV

from qa_core.contract import CLS_ID, PAD_ID, SEP_ID
from qa_core.squad import SquadExample, align_answer, featurize, pad_batch, read_squad
from qa_core.squad.features import offsets_array
from qa_core.tokenizer import XLNetTokenizer

# segment ids of a SQuAD feature in the original (run_squad.py)
SEG_PARAGRAPH, SEG_QUESTION, SEG_CLS, SEG_PAD = 0, 1, 2, 3


@pytest.fixture(scope="module")
def dev_examples() -> list[SquadExample]:
    return read_squad(SAMPLE_DEV)


# =====================================================================================================
# SQuAD features: run_squad.py convert_examples_to_features / _check_is_max_context
# =====================================================================================================


def _orig_window_spans(n_doc: int, room: int, stride: int) -> list[tuple[int, int]]:
    """(first token, length) of each document window, as run_squad.py convert_examples_to_features
    slides them. Every window holds ``room`` tokens except the last, which stops at the document's end;
    consecutive windows start ``min(room, stride)`` apart (so a stride wider than the room tiles the
    document without gaps); the first window that reaches the end is the last. No window for an empty
    document. (``room`` > 0.)"""
    if n_doc == 0:
        return []
    step = min(room, stride)
    n_windows = 1 + max(0, -(-(n_doc - room) // step))  # 1 + ceil((n_doc - room) / step)
    return [(k * step, min(room, n_doc - k * step)) for k in range(n_windows)]


def _orig_best_window(spans: list[tuple[int, int]], n_doc: int) -> np.ndarray:
    """Per document token, the window that gives it the most context, as run_squad.py
    _check_is_max_context decides: among the windows containing the token, the highest
    ``min(tokens before it, tokens after it within the window) + 0.01 * window length``; ties go to the
    earliest window."""
    first, length = (np.array([s[i] for s in spans])[:, None] for i in (0, 1))
    last = first + length - 1
    pos = np.arange(n_doc)[None, :]
    score = np.minimum(pos - first, last - pos) + 0.01 * length
    return np.where((first <= pos) & (pos <= last), score, -np.inf).argmax(axis=0)


def _orig_windows(
    doc_ids: list[int],
    query_ids: list[int],
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    is_training: bool,
    is_impossible: bool,
    answer_first: int | None,
    answer_last: int | None,
    with_max_context: bool = True,
) -> list[dict]:
    """The features run_squad.py convert_examples_to_features makes from one tokenized example, as
    dicts, padding included. ``answer_first`` / ``answer_last`` are the answer's first and last document
    token. Facts encoded:

    - the question keeps its first ``max_query_length`` tokens; a window then has room for
      ``max_seq_length - len(question) - 3`` document tokens, placed as in ``_orig_window_spans``;
    - layout ``paragraph <sep> question <sep> <cls>``, <cls> being the last real position; segment id 0
      for the paragraph and its <sep>, 1 for the question and its <sep>, 2 for <cls>; p_mask 0 on the
      paragraph and <cls>, 1 elsewhere;
    - padding up to ``max_seq_length``: input id 0, input_mask 1 (1 = padding), segment id 3, p_mask 1;
    - a paragraph token's max-context flag: this window is its ``_orig_best_window``
      (``with_max_context=False`` skips that quadratic work and leaves every flag None);
    - training labels: the answer's positions within the window when the whole answer lies in it;
      otherwise, and always for an unanswerable question, both positions on <cls> and the window
      impossible. Without training the positions are None and the example's flag is kept.
    """
    question = list(query_ids[:max_query_length])
    spans = _orig_window_spans(len(doc_ids), max_seq_length - len(question) - 3, doc_stride)
    owner = _orig_best_window(spans, len(doc_ids)) if with_max_context and spans else None
    n_question = len(question) + 1  # with its <sep>
    features = []
    for w, (first, size) in enumerate(spans):
        ids = [*doc_ids[first : first + size], SEP_ID, *question, SEP_ID, CLS_ID]
        n_real = len(ids)
        n_pad = max_seq_length - n_real
        cls_index = n_real - 1
        if not is_training:
            labels = (None, None, is_impossible)
        elif not is_impossible and first <= answer_first and answer_last < first + size:
            labels = (answer_first - first, answer_last - first, False)
        else:
            labels = (cls_index, cls_index, True)
        flags = [None] * size if owner is None else (owner[first : first + size] == w).tolist()
        features.append(
            dict(
                span=(first, size),
                n_real=n_real,
                input_ids=ids + [0] * n_pad,
                input_mask=[0] * n_real + [1] * n_pad,
                segment_ids=[SEG_PARAGRAPH] * (size + 1)
                + [SEG_QUESTION] * n_question
                + [SEG_CLS]
                + [SEG_PAD] * n_pad,
                p_mask=[0] * size + [1] * (n_question + 1) + [0] + [1] * n_pad,
                token_is_max_context=flags,
                paragraph_len=size,
                cls_index=cls_index,
                start_position=labels[0],
                end_position=labels[1],
                is_impossible=labels[2],
            )
        )
    return features


def _feature_examples(dev_examples: list[SquadExample]) -> list[SquadExample]:
    """The longest answerable and unanswerable sample-dev questions (many windows) plus the first few."""
    answerable = sorted((e for e in dev_examples if e.answers), key=lambda e: -len(e.context))[:4]
    impossible = sorted((e for e in dev_examples if not e.answers), key=lambda e: -len(e.context))[:2]
    return answerable + impossible + dev_examples[:3]


@pytest.mark.parametrize(
    ("max_seq_len", "doc_stride", "max_query_len"),
    [(384, 128, 64), (64, 16, 16), (80, 7, 24), (48, 100, 8), (40, 36, 6)],
    ids=["recipe", "stride16", "stride7", "stride>room", "stride=room"],
)
def test_features_match_convert_examples_to_features(
    xlnet_tok: XLNetTokenizer,
    dev_examples: list[SquadExample],
    max_seq_len: int,
    doc_stride: int,
    max_query_len: int,
) -> None:
    """Windows (stride arithmetic), P <sep> Q <sep> <cls> layout, segment ids, p_mask, max-context
    flags, and the training labels (answer, or <cls> when unanswerable / not wholly in the window)."""
    n_windows = n_cls_labels = 0
    for ex in _feature_examples(dev_examples):
        ctx_ids, offsets = xlnet_tok.encode_with_offsets(ex.context)
        q_ids = xlnet_tok.encode(ex.question)
        tok_start = tok_end = None
        if ex.answers:
            text, start = ex.answers[0]
            tok_start, tok_end = align_answer(offsets_array(offsets), start, text)
        for is_training in (True, False):
            expected = _orig_windows(
                ctx_ids,
                q_ids,
                max_seq_len,
                doc_stride,
                max_query_len,
                is_training,
                ex.is_impossible,
                tok_start,
                tok_end,
            )
            got = featurize(
                [ex],
                xlnet_tok,
                max_seq_len=max_seq_len,
                doc_stride=doc_stride,
                max_query_len=max_query_len,
                is_training=is_training,
            )
            assert [(f.paragraph_start, f.paragraph_len) for f in got] == [e["span"] for e in expected]
            padded = pad_batch(got, pad_to=max_seq_len)
            for k, (f, e) in enumerate(zip(got, expected, strict=True)):
                n = e["n_real"]
                assert len(f) == n
                assert f.input_ids.tolist() == e["input_ids"][:n]
                assert f.token_type_ids.tolist() == e["segment_ids"][:n]
                assert f.p_mask.tolist() == e["p_mask"][:n]
                assert f.cls_index == e["cls_index"]
                assert f.token_is_max_context[: f.paragraph_len].tolist() == e["token_is_max_context"]
                assert not f.token_is_max_context[f.paragraph_len :].any()
                assert (f.start_position, f.end_position) == (e["start_position"], e["end_position"])
                assert f.is_impossible == e["is_impossible"]
                # padding to max_seq_len: same mask (inverted convention), segment and p_mask values; the
                # original pads input ids with 0 (<unk>), ours with <pad> (5) - padding is masked out anyway
                assert padded["attention_mask"][k].tolist() == [1 - m for m in e["input_mask"]]
                assert padded["token_type_ids"][k].tolist() == e["segment_ids"]
                assert padded["p_mask"][k].tolist() == e["p_mask"]
                assert padded["input_ids"][k, :n].tolist() == e["input_ids"][:n]
                assert (padded["input_ids"][k, n:] == PAD_ID).all() and not any(e["input_ids"][n:])
                n_windows += 1
                n_cls_labels += is_training and e["start_position"] == e["cls_index"]
    assert n_windows > 20 and n_cls_labels > 0


def test_answer_labels_at_window_edges(xlnet_tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    """An answer starting on a window's first token or ending on its last is labelled there; one token
    further out the window is labelled <cls>, as doc_start <= start and end <= doc_end in the original."""
    wanted = {"starts on first", "starts one before", "ends on last", "ends one after"}
    seen: set[str] = set()
    examples = sorted((e for e in dev_examples if e.answers), key=lambda e: -len(e.context))[:8]
    for ex in examples:
        ctx_ids, offsets = xlnet_tok.encode_with_offsets(ex.context)
        q_ids = xlnet_tok.encode(ex.question)
        text, start = ex.answers[0]
        s, e = align_answer(offsets_array(offsets), start, text)
        for max_seq_len in range(30, 90, 3):
            for stride in (7, 13, 500):  # 500 > room: windows advance by their length
                expected = _orig_windows(ctx_ids, q_ids, max_seq_len, stride, 12, True, False, s, e, False)
                got = featurize(
                    [ex],
                    xlnet_tok,
                    max_seq_len=max_seq_len,
                    doc_stride=stride,
                    max_query_len=12,
                    is_training=True,
                )
                assert [(f.paragraph_start, f.paragraph_len) for f in got] == [x["span"] for x in expected]
                for f, x in zip(got, expected, strict=True):
                    labels = (f.start_position, f.end_position, f.is_impossible)
                    assert labels == (x["start_position"], x["end_position"], x["is_impossible"])
                    first, last = f.paragraph_start, f.paragraph_start + f.paragraph_len - 1
                    for name, hit in (
                        ("starts on first", s == first and e <= last),
                        ("starts one before", s == first - 1 and e <= last),
                        ("ends on last", e == last and s >= first),
                        ("ends one after", e == last + 1 and s >= first),
                    ):
                        if hit:
                            seen.add(name)
        if seen == wanted:
            break
    assert seen == wanted
