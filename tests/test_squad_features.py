"""XLNet SQuAD features with the real tokenizer on the real data files."""

from __future__ import annotations

import time

import numpy as np
import pytest
from paths import SAMPLE, SHARED_DEV_NAME, shared_squad_file

from qa_core import contract
from qa_core.squad import (
    SquadExample,
    align_answer,
    alignment_report,
    answer_survives,
    feature_answer_text,
    featurize,
    featurize_one,
    pad_batch,
    read_squad,
    subsample_out_of_window,
)
from qa_core.squad.alignment import offsets_array
from qa_core.tokenizer import XLNetTokenizer
from train.tokenizer import train_spm

SHARED_DEV = shared_squad_file(SHARED_DEV_NAME)

# As the project brief: 2000 pieces trained on the ~270 KB sample. train_spm's defaults (split_digits, the
# README's punctuation symbols kept as pieces of their own) stop pieces that glue digits or words to
# punctuation ("1971,", ").", '".'), which would leave answers unrecoverable; see the alignment test below.
VOCAB_SIZE = 2000


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> XLNetTokenizer:
    out = tmp_path_factory.mktemp("spm")
    return XLNetTokenizer(train_spm([SAMPLE / "corpus.json", SAMPLE / "train.json"], out, VOCAB_SIZE))


@pytest.fixture(scope="module")
def dev_examples() -> list[SquadExample]:
    return read_squad(SAMPLE / "dev.json")


def _long_example(dev_examples: list[SquadExample]) -> SquadExample:
    """The answerable sample-dev example with the longest context."""
    return max((e for e in dev_examples if e.answers), key=lambda e: len(e.context))


# ---- answer alignment ------------------------------------------------------------------------------


def test_alignment_on_shared_dev(tok: XLNetTokenizer) -> None:
    if SHARED_DEV is None:
        pytest.skip("../shared is absent (a fresh clone): the sample is tested instead elsewhere")
    n_ok, n_total, failures = alignment_report(read_squad(SHARED_DEV), tok)
    rate = n_ok / n_total
    print(f"\nanswer spans surviving text -> tokens -> text: {n_ok}/{n_total} = {100 * rate:.2f}%")
    for f in failures:
        print(f"  {f.qas_id}: {f.answer_text!r} @ {f.answer_start} -> {f.recovered_text!r}")
    assert n_total > 4000
    assert rate >= 0.995


def test_alignment_on_sample(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    n_ok, n_total, failures = alignment_report(read_squad(SAMPLE / "train.json") + dev_examples, tok)
    print(f"\nsample: {n_ok}/{n_total} answers survive; failures: {failures}")
    assert n_ok / n_total >= 0.99
    # every failure really is one: recovered text differs from the answer
    assert all(f.recovered_text != f.answer_text for f in failures)


def test_align_answer_rules() -> None:
    # tokens: "▁Paris"(0,5) "▁is"(6,8) "▁"(9,9: a lone marker) "("(9,10) "18"(10,12) "97,"(12,15)
    offsets = offsets_array([(0, 5), (6, 8), (9, 9), (9, 10), (10, 12), (12, 15)])
    context = "Paris is (1897, x"
    assert align_answer(offsets, 0, "Paris") == (0, 0)
    assert align_answer(offsets, 0, "Paris is") == (0, 1)
    assert align_answer(offsets, 5, " is ") == (1, 1)  # surrounding whitespace ignored
    assert align_answer(offsets, 9, "(") == (3, 3)  # the zero-width marker is not part of it
    assert align_answer(offsets, 10, "1897") == (4, 5)  # overlap: "97," belongs to the answer
    assert answer_survives(context, offsets, "Paris is", 0)
    assert not answer_survives(context, offsets, "1897", 10)  # comes back as "1897,"
    assert align_answer(offsets, 5, " ") is None
    assert align_answer(offsets_array([]), 0, "x") is None


def test_offsets_round_trip_with_odd_whitespace(tok: XLNetTokenizer) -> None:
    context = "  Caf\u00e9  \u201cNo\u00ebl\u201d  was founded in\n\n1901 ``by'' Jos\u00e9.  "
    ex = SquadExample("w", "t", "Who founded it?", context, [("Jos\u00e9", context.index("Jos"))], False)
    (f,) = featurize([ex], tok, is_training=True)
    assert feature_answer_text(f, context) == "Jos\u00e9"
    for i in range(f.paragraph_len):
        a, b = f.token_to_char[i]
        assert 0 <= a <= b <= len(context)
        assert context[a:b] == context[a:b].strip()


# ---- layout -----------------------------------------------------------------------------------------


def _check_layout(f, tok: XLNetTokenizer, ex: SquadExample, max_seq_len: int, max_query_len: int) -> None:
    ctx_ids, offsets = tok.encode_with_offsets(ex.context)
    q_ids = tok.encode(ex.question)[:max_query_len]
    n, m = f.paragraph_len, len(q_ids)
    s = f.paragraph_start
    assert len(f) == n + m + 3 <= max_seq_len
    assert f.input_ids.tolist() == ctx_ids[s : s + n] + [contract.SEP_ID] + q_ids + [
        contract.SEP_ID,
        contract.CLS_ID,
    ]
    assert f.token_type_ids.tolist() == [contract.SEG_ID_A] * (n + 1) + [contract.SEG_ID_B] * (m + 1) + [
        contract.SEG_ID_CLS
    ]
    assert f.p_mask.tolist() == [0] * n + [1] * (m + 2) + [0]
    assert f.attention_mask.tolist() == [1] * len(f)
    assert f.cls_index == len(f) - 1 and f.input_ids[f.cls_index] == contract.CLS_ID
    assert f.token_to_char[:n].tolist() == [list(o) for o in offsets[s : s + n]]
    assert (f.token_to_char[n:] == -1).all()
    assert not f.token_is_max_context[n:].any()
    for arr in (f.input_ids, f.attention_mask, f.token_type_ids, f.p_mask, f.token_to_char):
        assert arr.dtype == np.int64


def test_layout_and_windows_cover_paragraph(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    max_seq_len, stride, max_q = 96, 32, 16
    examples = dev_examples[:40]
    features = featurize(examples, tok, max_seq_len=max_seq_len, doc_stride=stride, max_query_len=max_q)
    by_example: dict[int, list] = {}
    for f in features:
        by_example.setdefault(f.example_index, []).append(f)
        _check_layout(f, tok, examples[f.example_index], max_seq_len, max_q)
        assert f.qas_id == examples[f.example_index].qas_id
        assert f.start_position is None and f.is_impossible == examples[f.example_index].is_impossible
    assert sorted(by_example) == list(range(len(examples)))
    assert any(len(fs) > 2 for fs in by_example.values())
    for i, fs in by_example.items():
        n_tokens = len(tok.encode(examples[i].context))
        assert [f.window_index for f in fs] == list(range(len(fs)))
        assert fs[0].paragraph_start == 0
        assert fs[-1].paragraph_start + fs[-1].paragraph_len == n_tokens
        for a, b in zip(fs, fs[1:], strict=False):
            assert b.paragraph_start == a.paragraph_start + stride  # windows advance by the stride
            assert b.paragraph_start < a.paragraph_start + a.paragraph_len  # and overlap: no gap
        # every paragraph token is the max-context token of exactly one window
        owners = np.zeros(n_tokens, dtype=int)
        for f in fs:
            owners[f.paragraph_start : f.paragraph_start + f.paragraph_len] += f.token_is_max_context[
                : f.paragraph_len
            ]
        assert (owners == 1).all()


def _reference_is_max_context(spans: list[tuple[int, int]], cur: int, position: int) -> bool:
    """The original run_squad.py ``_check_is_max_context``, transcribed."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return cur == best_index


def test_max_context_matches_original(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    ex = _long_example(dev_examples)
    for max_seq_len, stride in ((64, 16), (80, 7), (128, 64)):
        fs = featurize([ex], tok, max_seq_len=max_seq_len, doc_stride=stride, max_query_len=24)
        spans = [(f.paragraph_start, f.paragraph_len) for f in fs]
        assert len(spans) > 3
        for w, f in enumerate(fs):
            expected = [
                _reference_is_max_context(spans, w, f.paragraph_start + i) for i in range(f.paragraph_len)
            ]
            assert f.token_is_max_context[: f.paragraph_len].tolist() == expected


def test_question_truncated(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    ex = dev_examples[0]
    long_q = " ".join([ex.question] * 20)
    (f,) = featurize_one(long_q, ex.context, tok, max_seq_len=512, max_query_len=64)
    q_ids = tok.encode(long_q)
    assert len(q_ids) > 64
    n = f.paragraph_len
    assert f.input_ids[n + 1 : n + 65].tolist() == q_ids[:64]  # the first 64 tokens are kept
    assert len(f) == n + 64 + 3


def test_max_seq_len_512(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    ex = _long_example(dev_examples)
    n_tokens = len(tok.encode(ex.context))
    f384 = featurize([ex], tok, max_seq_len=384)
    f512 = featurize([ex], tok, max_seq_len=512)
    assert len(f512) <= len(f384)
    for f in f512:
        _check_layout(f, tok, ex, 512, 64)
    if n_tokens + len(tok.encode(ex.question)) + 3 <= 512:
        assert len(f512) == 1 and f512[0].paragraph_len == n_tokens


def test_featurize_one_equals_featurize(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    ex = _long_example(dev_examples)
    a = featurize([ex], tok, max_seq_len=128, doc_stride=48)
    b = featurize_one(ex.question, ex.context, tok, max_seq_len=128, doc_stride=48)
    assert len(a) == len(b) > 1
    for x, y in zip(a, b, strict=True):
        for name in (
            "input_ids",
            "attention_mask",
            "token_type_ids",
            "p_mask",
            "token_to_char",
            "token_is_max_context",
        ):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name
        assert (x.cls_index, x.paragraph_start, x.paragraph_len) == (
            y.cls_index,
            y.paragraph_start,
            y.paragraph_len,
        )


def test_empty_context_gives_one_window(tok: XLNetTokenizer) -> None:
    (f,) = featurize_one("Who is there?", "", tok)
    q = tok.encode("Who is there?")
    assert f.paragraph_len == 0
    assert f.input_ids.tolist() == [contract.SEP_ID, *q, contract.SEP_ID, contract.CLS_ID]
    assert f.p_mask.tolist() == [1] * (len(q) + 2) + [0]


def test_bad_lengths(tok: XLNetTokenizer) -> None:
    with pytest.raises(ValueError, match="doc_stride"):
        featurize_one("q", "c", tok, doc_stride=0)
    with pytest.raises(ValueError, match="leaves no room"):
        featurize_one("q", "c", tok, max_seq_len=60, max_query_len=64)


# ---- training labels ---------------------------------------------------------------------------------


def test_labels_answerable_and_unanswerable(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    features = featurize(dev_examples, tok, is_training=True)
    assert {f.example_index for f in features} == set(range(len(dev_examples)))
    n_checked = 0
    for f in features:
        ex = dev_examples[f.example_index]
        assert f.start_position is not None and f.end_position is not None
        if ex.is_impossible:
            assert f.is_impossible and f.start_position == f.end_position == f.cls_index
            continue
        text, start = ex.answers[0]
        if f.is_impossible:  # only when the answer is not inside this window
            assert f.start_position == f.end_position == f.cls_index
            continue
        assert 0 <= f.start_position <= f.end_position < f.paragraph_len
        assert f.p_mask[f.start_position] == 0 and f.p_mask[f.end_position] == 0
        a, b = f.token_to_char[f.start_position, 0], f.token_to_char[f.end_position, 1]
        assert a <= start and start + len(text) <= b  # the labelled tokens cover the answer
        if answer_survives(ex.context, offsets_array(tok.encode_with_offsets(ex.context)[1]), text, start):
            assert feature_answer_text(f, ex.context) == text
            n_checked += 1
    assert n_checked > 90


def test_labels_answer_outside_window(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    ex = _long_example(dev_examples)
    text, start = ex.answers[0]
    fs = featurize([ex], tok, max_seq_len=48, doc_stride=16, max_query_len=16, is_training=True)
    offsets = offsets_array(tok.encode_with_offsets(ex.context)[1])
    s, e = align_answer(offsets, start, text)
    inside = [f for f in fs if f.paragraph_start <= s and e < f.paragraph_start + f.paragraph_len]
    outside = [f for f in fs if f not in inside]
    assert inside and outside
    for f in inside:
        assert not f.is_impossible
        assert (f.start_position, f.end_position) == (s - f.paragraph_start, e - f.paragraph_start)
    for f in outside:  # includes windows that hold only part of the answer
        assert f.is_impossible and f.start_position == f.end_position == f.cls_index


def test_whitespace_answer_is_skipped_in_training(
    tok: XLNetTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    ex = SquadExample("ws", "t", "q?", "a  b", [("  ", 1)], False)
    assert featurize([ex], tok, is_training=True) == []
    assert "skipped 1 training examples" in caplog.text
    assert len(featurize([ex], tok)) == 1  # without labels it is featurised as usual


# ---- batching ---------------------------------------------------------------------------------------


def test_pad_batch(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    features = featurize(dev_examples[:6], tok, max_seq_len=128, doc_stride=64, is_training=True)[:7]
    lengths = [len(f) for f in features]
    assert len(set(lengths)) > 1
    batch = pad_batch(features)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "p_mask"}
    assert all(v.dtype == np.int64 and v.shape == (7, max(lengths)) for v in batch.values())
    for i, f in enumerate(features):
        k = len(f)
        assert batch["input_ids"][i, :k].tolist() == f.input_ids.tolist()
        assert (batch["input_ids"][i, k:] == contract.PAD_ID).all()
        assert (batch["attention_mask"][i, :k] == 1).all() and (batch["attention_mask"][i, k:] == 0).all()
        assert (batch["token_type_ids"][i, k:] == contract.SEG_ID_PAD).all()
        assert batch["p_mask"][i, :k].tolist() == f.p_mask.tolist() and (batch["p_mask"][i, k:] == 1).all()
        assert batch["input_ids"][i, f.cls_index] == contract.CLS_ID  # right padding keeps positions
    assert pad_batch(features, multiple_of=64)["input_ids"].shape == (7, 128)
    assert pad_batch(features, pad_to=200)["input_ids"].shape == (7, 200)
    assert pad_batch(features, pad_to=200, multiple_of=64)["p_mask"].shape == (7, 256)
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_batch(features, pad_to=10)
    with pytest.raises(ValueError, match="no features"):
        pad_batch([])
    labelled = pad_batch(features, include_labels=True)
    assert labelled["cls_index"].tolist() == [f.cls_index for f in features]
    assert labelled["start_positions"].tolist() == [f.start_position for f in features]
    assert labelled["is_impossible"].tolist() == [int(f.is_impossible) for f in features]
    with pytest.raises(ValueError, match="is_training=True"):
        pad_batch(featurize(dev_examples[:1], tok), include_labels=True)


# ---- speed ------------------------------------------------------------------------------------------


def test_featurize_speed_and_linear_work(tok: XLNetTokenizer, dev_examples: list[SquadExample]) -> None:
    ex = min((e for e in dev_examples if len(e.context.split()) >= 150), key=lambda e: len(e.context))
    featurize_one(ex.question, ex.context, tok)
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        featurize_one(ex.question, ex.context, tok)
    per_q = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        tok.encode_with_offsets(ex.context)
    tokenize = (time.perf_counter() - t0) / n
    print(
        f"\nfeaturize_one, {len(ex.context.split())}-word context: {1e6 * per_q:.0f} us/question "
        f"(of which encode_with_offsets {1e6 * tokenize:.0f} us)"
    )

    # Linear work, counted rather than timed: a 40x longer context is tokenized once (never per window),
    # and yields windows that advance by the stride, so its total window tokens grow 40x, not 1600x.
    class Counting:
        def __init__(self, inner: XLNetTokenizer) -> None:
            self.inner, self.encoded_chars = inner, 0

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        def encode_with_offsets(self, text: str, *args, **kwargs):
            self.encoded_chars += len(text)
            return self.inner.encode_with_offsets(text, *args, **kwargs)

        def encode(self, text: str, *args, **kwargs):
            self.encoded_chars += len(text)
            return self.inner.encode(text, *args, **kwargs)

    def work(context: str) -> tuple[int, int, int]:
        counting = Counting(tok)
        features = featurize_one(ex.question, context, counting, max_seq_len=128, doc_stride=64)
        return counting.encoded_chars, len(features), sum(len(f.input_ids) for f in features)

    short_chars, short_windows, short_tokens = work(ex.context)
    long_context = " ".join([ex.context] * 40)
    long_chars, long_windows, long_tokens = work(long_context)
    print(
        f"featurize_one x40 context: {long_windows} windows (x1: {short_windows}), {long_tokens} window tokens"
    )
    assert short_chars <= len(ex.context) + len(ex.question) + 1  # the context is tokenized once
    assert long_chars <= len(long_context) + len(ex.question) + 1  # ... however many windows it makes
    assert long_windows <= 40 * (short_windows + 1) and long_tokens <= 45 * short_tokens + 128 * 40


def test_subsample_out_of_window_keeps_answers_and_unanswerable_questions(tok: XLNetTokenizer) -> None:
    """Out-of-window windows (answerable question, answer elsewhere) are thinned; nothing else is."""
    examples = read_squad(SAMPLE / "train.json")[:120]
    features = featurize(examples, tok, is_training=True, max_seq_len=64, doc_stride=32, max_query_len=24)

    def out_of_window(f) -> bool:
        return f.is_impossible and bool(examples[f.example_index].answers)

    n_out = sum(out_of_window(f) for f in features)
    assert n_out > 100  # short windows over long paragraphs: many
    none = subsample_out_of_window(features, examples, 0.0)
    assert [f for f in features if not out_of_window(f)] == none
    half = subsample_out_of_window(features, examples, 0.5, seed=3)
    kept = sum(out_of_window(f) for f in half)
    assert 0.35 * n_out < kept < 0.65 * n_out
    assert half == subsample_out_of_window(features, examples, 0.5, seed=3)  # deterministic
    assert subsample_out_of_window(features, examples, 1.0) == list(features)
    with pytest.raises(ValueError, match="keep must be in"):
        subsample_out_of_window(features, examples, 1.5)
