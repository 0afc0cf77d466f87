"""Answer decoding from hand-made logits, over several windows, with the real tokenizer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from paths import SAMPLE

from qa_core.squad import (
    DecodeOptions,
    Feature,
    SquadExample,
    align_answer,
    answers_and_na_probs,
    decode,
    decode_all,
    decode_all_beam,
    decode_beam,
    featurize,
    featurize_one,
    read_squad,
)
from qa_core.squad.alignment import offsets_array
from qa_core.tokenizer import XLNetTokenizer
from train.squad import evaluate
from train.tokenizer import train_spm

WINDOW = {"max_seq_len": 128, "doc_stride": 48, "max_query_len": 32}


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> XLNetTokenizer:
    out = tmp_path_factory.mktemp("spm")
    return XLNetTokenizer(train_spm([SAMPLE / "corpus.json", SAMPLE / "train.json"], out, 2000))


@pytest.fixture(scope="module")
def dev_examples() -> list[SquadExample]:
    return read_squad(SAMPLE / "dev.json")


@pytest.fixture(scope="module")
def case(tok: XLNetTokenizer, dev_examples: list[SquadExample]):
    """A long example whose (surviving) answer lies where two windows overlap."""
    for ex in sorted(dev_examples, key=lambda e: -len(e.context)):
        offsets = offsets_array(tok.encode_with_offsets(ex.context)[1])
        feats = featurize([ex], tok, **WINDOW)
        for text, start in ex.answers:
            s, e = align_answer(offsets, start, text)
            holders = [f for f in feats if f.paragraph_start <= s and e < f.paragraph_start + f.paragraph_len]
            ctx = ex.context
            survives = ctx[offsets[s, 0] : offsets[e, 1]] == text
            if len(holders) >= 2 and survives and e > s and len(feats) >= 3:
                return ex, feats, text, start, s, e
    raise AssertionError("no suitable example in the sample dev set")


def _zeros(feats: list[Feature]) -> list[np.ndarray]:
    return [np.zeros(len(f)) for f in feats]


def _owner(feats: list[Feature], token: int) -> int:
    """The window in which paragraph token ``token`` has max context."""
    (w,) = [
        i
        for i, f in enumerate(feats)
        if f.paragraph_start <= token < f.paragraph_start + f.paragraph_len
        and f.token_is_max_context[token - f.paragraph_start]
    ]
    return w


def _point_at(
    feats: list[Feature], s: int, e: int, value: float = 10.0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Logits with a peak at paragraph tokens s (start) and e (end) in every window holding both."""
    start, end = _zeros(feats), _zeros(feats)
    for w, f in enumerate(feats):
        if f.paragraph_start <= s and e < f.paragraph_start + f.paragraph_len:
            start[w][s - f.paragraph_start] = value
            end[w][e - f.paragraph_start] = value
    return start, end


def _log_softmax_p(logits: np.ndarray, p_mask: np.ndarray) -> np.ndarray:
    keep = p_mask == 0
    z = logits[keep]
    out = np.full(len(logits), -np.inf)
    out[keep] = z - (z.max() + math.log(np.exp(z - z.max()).sum()))
    return out


def test_span_across_two_windows(case) -> None:
    ex, feats, text, start, s, e = case
    start_logits, end_logits = _point_at(feats, s, e)
    cls = np.full(len(feats), -5.0)
    pred = decode(ex, feats, start_logits, end_logits, cls)
    assert pred.qas_id == ex.qas_id
    assert pred.text == text
    assert (pred.start, pred.end) == (start, start + len(text))
    assert ex.context[pred.start : pred.end] == pred.text
    assert not pred.is_impossible
    assert pred.no_answer_prob == pytest.approx(1 / (1 + math.exp(5.0)))
    best = pred.n_best[0]
    assert best.window_index == _owner(feats, s)  # decoded once, in the start's max-context window
    assert (best.start_token, best.end_token) == (
        s - feats[best.window_index].paragraph_start,
        e - feats[best.window_index].paragraph_start,
    )
    assert sum(1 for x in pred.n_best if (x.start, x.end) == (pred.start, pred.end)) == 1
    # the score is start_log_prob + end_log_prob, log-softmax over p_mask == 0 positions (cls included)
    f = feats[best.window_index]
    slp = _log_softmax_p(start_logits[best.window_index], f.p_mask)
    elp = _log_softmax_p(end_logits[best.window_index], f.p_mask)
    assert best.start_log_prob == pytest.approx(slp[best.start_token])
    assert best.end_log_prob == pytest.approx(elp[best.end_token])
    assert best.score == pytest.approx(best.start_log_prob + best.end_log_prob)
    # n-best: sorted, distinct, offsets consistent, probabilities a softmax over the scores
    scores = [x.score for x in pred.n_best]
    assert scores == sorted(scores, reverse=True) and len(pred.n_best) == 20
    assert len({(x.start, x.end) for x in pred.n_best}) == len(pred.n_best)
    assert all(ex.context[x.start : x.end] == x.text and x.text for x in pred.n_best)
    probs = np.exp(np.array(scores) - max(scores))
    assert [x.probability for x in pred.n_best] == pytest.approx((probs / probs.sum()).tolist())
    assert pred.to_dict()["n_best"][0]["text"] == text


def test_start_outside_max_context_is_ignored(case) -> None:
    ex, feats, text, start, s, e = case
    owner = _owner(feats, s)
    other = next(
        w
        for w, f in enumerate(feats)
        if w != owner and f.paragraph_start <= s and e < f.paragraph_start + f.paragraph_len
    )
    start_logits, end_logits = _zeros(feats), _zeros(feats)
    f = feats[other]
    start_logits[other][s - f.paragraph_start] = 30.0  # peaks only where s is NOT max-context
    end_logits[other][e - f.paragraph_start] = 30.0
    pred = decode(ex, feats, start_logits, end_logits, np.zeros(len(feats)) - 3)
    assert all(feats[x.window_index].token_is_max_context[x.start_token] for x in pred.n_best)
    assert not any(x.window_index == other and x.start_token == s - f.paragraph_start for x in pred.n_best)


def test_padded_2d_logits_equal_list_input(case) -> None:
    ex, feats, _, _, s, e = case
    rng = np.random.default_rng(0)
    start_logits = [rng.normal(size=len(f)) for f in feats]
    end_logits = [rng.normal(size=len(f)) for f in feats]
    width = max(len(f) for f in feats) + 5
    start_2d = rng.normal(size=(len(feats), width)) * 100  # garbage in the padding
    end_2d = rng.normal(size=(len(feats), width)) * 100
    for w, f in enumerate(feats):
        start_2d[w, : len(f)] = start_logits[w]
        end_2d[w, : len(f)] = end_logits[w]
    cls = rng.normal(size=len(feats))
    a = decode(ex, feats, start_logits, end_logits, cls)
    b = decode(ex.context, feats, start_2d, end_2d, cls)
    assert (a.text, a.start, a.end, a.no_answer_prob) == (b.text, b.start, b.end, b.no_answer_prob)
    assert [x.text for x in a.n_best] == [x.text for x in b.n_best]
    assert b.qas_id == ""


def test_no_answer_threshold(case) -> None:
    ex, feats, text, start, s, e = case
    start_logits, end_logits = _point_at(feats, s, e)
    cls = np.linspace(3.0, 1.0, len(feats))
    cls[1] = -1.0  # the most "answerable" window decides: sigmoid(-1) = 0.2689
    pred = decode(ex, feats, start_logits, end_logits, cls)
    assert pred.null_logit == -1.0
    assert pred.no_answer_prob == pytest.approx(0.26894142)
    assert not pred.is_impossible and pred.text == text
    pred = decode(ex, feats, start_logits, end_logits, cls, DecodeOptions.spans(threshold=0.25))
    assert pred.is_impossible and pred.text == "" and (pred.start, pred.end) == (-1, -1)
    assert pred.best_span_text == text and pred.n_best[0].text == text  # the span is kept
    pred = decode(ex, feats, start_logits, end_logits, np.full(len(feats), 0.1))  # sigmoid(0.1) = 0.525
    assert pred.is_impossible and pred.text == ""
    pred = decode(
        ex, feats, start_logits, end_logits, np.full(len(feats), 0.1), DecodeOptions.spans(threshold=0.6)
    )
    assert not pred.is_impossible and pred.text == text


def test_max_answer_len_and_end_before_start(case) -> None:
    ex, feats, _, _, s, _ = case
    w = _owner(feats, s)
    f = feats[w]
    ls = s - f.paragraph_start
    start_logits, end_logits = _zeros(feats), _zeros(feats)
    start_logits[w][ls] = 20.0
    long_end = min(ls + 4, f.paragraph_len - 1)  # a span of long_end - ls + 1 tokens
    n_tok = long_end - ls + 1
    assert n_tok >= 3
    end_logits[w][long_end] = 20.0
    if ls >= 2:
        end_logits[w][ls - 2] = 25.0  # an even better end, but before the start
    pred = decode(
        ex,
        feats,
        start_logits,
        end_logits,
        np.zeros(len(feats)) - 2,
        DecodeOptions.spans(max_answer_len=n_tok),
    )
    best = pred.n_best[0]
    assert (best.window_index, best.start_token, best.end_token) == (w, ls, long_end)
    pred = decode(
        ex,
        feats,
        start_logits,
        end_logits,
        np.zeros(len(feats)) - 2,
        DecodeOptions.spans(max_answer_len=n_tok - 1),
    )
    assert (pred.n_best[0].window_index, pred.n_best[0].start_token, pred.n_best[0].end_token) != (
        w,
        ls,
        long_end,
    )
    for x in pred.n_best:
        assert x.start_token <= x.end_token
        assert x.end_token - x.start_token + 1 <= n_tok - 1
        assert x.end_token < feats[x.window_index].paragraph_len


def test_n_best_size(case) -> None:
    ex, feats, _, _, s, e = case
    start_logits, end_logits = _point_at(feats, s, e)
    pred = decode(ex, feats, start_logits, end_logits, np.zeros(len(feats)), DecodeOptions.spans(n_best=3))
    assert len(pred.n_best) == 3
    assert sum(x.probability for x in pred.n_best) == pytest.approx(1.0)


def test_empty_context_has_no_answer(tok: XLNetTokenizer) -> None:
    feats = featurize_one("What is it?", "", tok)
    pred = decode("", feats, _zeros(feats), _zeros(feats), [-4.0])
    assert pred.is_impossible and pred.text == "" and pred.n_best == []


def test_decode_input_errors(case) -> None:
    ex, feats, *_ = case
    with pytest.raises(ValueError, match="cls_logits"):
        decode(ex, feats, _zeros(feats), _zeros(feats), [0.0])
    with pytest.raises(ValueError, match="positions"):
        decode(ex, feats, [np.zeros(3)] * len(feats), _zeros(feats), np.zeros(len(feats)))
    with pytest.raises(ValueError, match="no features"):
        decode(ex, [], [], [], [])


# ---- beam head --------------------------------------------------------------------------------------


def test_beam_decode(case) -> None:
    ex, feats, text, start, s, e = case
    k1, k2 = 3, 2
    w = _owner(feats, s)
    f = feats[w]
    ls, le = s - f.paragraph_start, e - f.paragraph_start
    n_q = len(f) - f.paragraph_len - 3
    W = len(feats)
    s_lp = np.full((W, k1), -9.0)
    s_ix = np.zeros((W, k1), dtype=np.int64)
    e_lp = np.full((W, k1, k2), -9.0)
    e_ix = np.zeros((W, k1, k2), dtype=np.int64)
    # window w: start 0 = the answer start, ends (answer end | before the start)
    s_ix[w, 0], s_lp[w, 0] = ls, -0.1
    e_ix[w, 0], e_lp[w, 0] = [le, max(ls - 1, 0)], [-0.2, -0.01]
    # start 1 is in the question part: invalid whatever its ends
    s_ix[w, 1], s_lp[w, 1] = f.paragraph_len + 1 + min(1, n_q), -0.01
    e_ix[w, 1], e_lp[w, 1] = [f.paragraph_len + 2, f.cls_index], [-0.01, -0.01]
    # start 2: a valid but worse span of one token, and a too-long one
    s_ix[w, 2], s_lp[w, 2] = ls, -0.1
    e_ix[w, 2], e_lp[w, 2] = [ls, min(ls + 40, f.paragraph_len - 1)], [-1.5, -0.01]
    # another window holding the answer start without max context: very confident, must be ignored
    other = next(
        v
        for v, g in enumerate(feats)
        if v != w and g.paragraph_start <= s and e < g.paragraph_start + g.paragraph_len
    )
    g = feats[other]
    s_ix[other], s_lp[other] = s - g.paragraph_start, -0.001
    e_ix[other], e_lp[other] = e - g.paragraph_start, -0.001
    cls = np.full(W, 2.0)
    cls[w] = -3.0

    pred = decode_beam(
        ex,
        feats,
        s_lp,
        s_ix,
        e_lp.reshape(W, k1 * k2),
        e_ix.reshape(W, k1 * k2),
        cls,
        DecodeOptions.spans(max_answer_len=30),
    )
    assert pred.text == text and (pred.start, pred.end) == (start, start + len(text))
    assert pred.no_answer_prob == pytest.approx(1 / (1 + math.exp(3.0)))
    assert pred.n_best[0].score == pytest.approx(-0.3)
    assert all(x.window_index == w for x in pred.n_best)  # everything else was invalid
    texts = {(x.start_token, x.end_token): x.score for x in pred.n_best}
    expected = {(ls, le): -0.3}
    if le != ls:
        expected[(ls, ls)] = -1.6
    assert texts == pytest.approx(expected)
    # [W, k1, k2] end arrays are read the same way as the flat start-major ones
    pred3 = decode_beam(ex, feats, s_lp, s_ix, e_lp, e_ix, cls, DecodeOptions.spans(max_answer_len=30))
    assert [(x.text, x.score) for x in pred3.n_best] == [(x.text, x.score) for x in pred.n_best]
    # a high no-answer logit everywhere: "" but the span is kept
    pred = decode_beam(ex, feats, s_lp, s_ix, e_lp, e_ix, np.full(W, 1.0))
    assert pred.is_impossible and pred.text == "" and pred.best_span_text == text


# ---- batch helpers -----------------------------------------------------------------------------------


def test_decode_all_matches_per_example(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    examples = dev_examples[:12]
    feats = featurize(examples, tok, **WINDOW)
    rng = np.random.default_rng(1)
    width = max(len(f) for f in feats)
    start = rng.normal(size=(len(feats), width))
    end = rng.normal(size=(len(feats), width))
    cls = rng.normal(size=len(feats))
    preds = decode_all(examples, feats, start, end, cls, DecodeOptions.spans(n_best=5))
    assert list(preds) == [e.qas_id for e in examples]
    for i, ex in enumerate(examples):
        idx = [j for j, f in enumerate(feats) if f.example_index == i]
        one = decode(
            ex, [feats[j] for j in idx], start[idx], end[idx], cls[idx], DecodeOptions.spans(n_best=5)
        )
        assert preds[ex.qas_id].text == one.text and preds[ex.qas_id].no_answer_prob == one.no_answer_prob
    # list rows of different lengths (batches padded differently) work the same
    ragged = decode_all(
        examples,
        feats,
        [r[: len(f) + (j % 3)] for j, (r, f) in enumerate(zip(start, feats, strict=True))],
        list(end),
        cls,
        DecodeOptions.spans(n_best=5),
    )
    assert {q: p.text for q, p in ragged.items()} == {q: p.text for q, p in preds.items()}

    answers, na_probs = answers_and_na_probs(preds)
    assert all(answers[q] for q in answers)  # best spans, the threshold is left to evaluate
    decided, _ = answers_and_na_probs(preds, apply_threshold=True)
    assert all(decided[q] == (answers[q] if na_probs[q] <= 0.5 else "") for q in answers)
    out = evaluate(examples, answers, na_probs, na_prob_thresh=0.5)
    assert out == evaluate(examples, decided, na_probs, na_prob_thresh=0.5) | {
        k: v for k, v in out.items() if k.startswith("best")
    }
    assert evaluate(examples, decided)["exact"] == out["exact"]


def test_decode_all_beam(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    examples = dev_examples[:8]
    feats = featurize(examples, tok, **WINDOW)
    rng = np.random.default_rng(2)
    k1, k2 = 4, 3
    s_ix = np.stack([rng.integers(0, len(f), size=k1) for f in feats])
    e_ix = np.stack([rng.integers(0, len(f), size=k1 * k2) for f in feats])
    e_ix = np.minimum(np.repeat(s_ix, k2, axis=1) + e_ix % 5, [[len(f) - 1] for f in feats])
    s_lp = -rng.random((len(feats), k1))
    e_lp = -rng.random((len(feats), k1 * k2))
    cls = rng.normal(size=len(feats))
    preds = decode_all_beam(examples, feats, s_lp, s_ix, e_lp, e_ix, cls)
    assert list(preds) == [e.qas_id for e in examples]
    for ex in examples:
        p = preds[ex.qas_id]
        assert all(ex.context[x.start : x.end] == x.text for x in p.n_best)
        assert p.text == ("" if p.is_impossible else p.n_best[0].text)


@pytest.mark.parametrize(
    "bad",
    [
        {"n_best": 0},
        {"n_best": True},
        {"max_answer_len": 2.5},
        {"threshold": float("nan")},
        {"threshold": 1.5},
    ],
)
def test_decode_options_refuse_what_would_decode_nothing_or_garbage(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        DecodeOptions.spans(**bad)


def test_a_span_ending_on_a_space_token_is_whole_words_without_the_space(tok: XLNetTokenizer) -> None:
    """sentencepiece gives the space before a number a piece of its own ("summer", "▁", "1", "9"), whose
    characters end where the number begins: a span the reader ends on it is trimmed, and its whole-word
    extent (what the re-ranker snaps to and shows) is trimmed too, never a word and a space."""
    context = "Prices kept increasing by summer 1973 and fell in winter 1974 across the region."
    (f,) = featurize_one("When did prices peak?", context, tok, **WINDOW)
    pieces = [(i, context[a:b]) for i, (a, b) in enumerate(f.token_to_char) if f.p_mask[i] == 0]
    spaces = [i for i, text in pieces if not text.strip()]
    assert spaces, f"no space token in {pieces}"
    start, end = np.full(len(f), -20.0), np.full(len(f), -20.0)
    words = [i for i, text in pieces if text.strip()]
    for s_tok in words:  # every span of real words that ends on a space token is likely
        start[s_tok] = 0.0
    for e_tok in spaces:
        end[e_tok] = 5.0
    pred = decode(context, [f], [start], [end], [-5.0], DecodeOptions.spans(20, 30))
    assert pred.n_best
    for e in pred.n_best:
        assert e.text == context[e.start : e.end] == e.text.strip(), e
        if e.word_start >= 0:
            whole = context[e.word_start : e.word_end]
            assert whole == whole.strip() and e.text in whole, (e.text, whole)
