"""Corpus -> token array -> parallel streams, and segments A/B (train.data.streams / segments)."""

from __future__ import annotations

import numpy as np
import pytest

from train.data import (
    CLS_ID,
    EOD_ID,
    SEP_ID,
    SegmentPair,
    TokenStream,
    assemble_example,
    split_a_and_b,
    stream_rows,
    tokenize_documents,
)


def _encode(text: str) -> list[int]:
    """One id per whitespace word: 'w12' -> 12."""
    return [int(w[1:]) for w in text.split()]


def _stream(n: int, sentence_len: int = 5) -> TokenStream:
    """ids 100, 101, ... with a new sentence every `sentence_len` tokens."""
    ids = np.arange(100, 100 + n, dtype=np.int32)
    return TokenStream(ids=ids, sentence_ids=(np.arange(n) // sentence_len).astype(np.int32))


# -- tokenisation ---------------------------------------------------------------------------------------


def test_tokenize_documents_ids_eod_and_sentence_ids() -> None:
    docs = [["w10 w11", "", "w12"], [], ["   ", "w13 w14 w15"]]
    ts = tokenize_documents(docs, _encode)
    assert ts.ids.tolist() == [10, 11, 12, EOD_ID, 13, 14, 15, EOD_ID]
    # one id per sentence; <eod> is glued to the last sentence of its document (as in the original)
    assert ts.sentence_ids.tolist() == [0, 0, 1, 1, 2, 2, 2, 2]
    assert ts.ids.dtype == np.int32 and len(ts) == 8


def test_token_stream_save_load_round_trip(tmp_path) -> None:
    ts = _stream(37)
    ts.save(tmp_path / "corpus.npz")
    back = TokenStream.load(tmp_path / "corpus.npz")
    np.testing.assert_array_equal(back.ids, ts.ids)
    np.testing.assert_array_equal(back.sentence_ids, ts.sentence_ids)


def test_token_stream_rejects_mismatched_arrays() -> None:
    with pytest.raises(ValueError, match="equal length"):
        TokenStream(ids=np.zeros(3, np.int32), sentence_ids=np.zeros(4, np.int32))


# -- stream layout --------------------------------------------------------------------------------------


def test_streams_are_contiguous_slices_and_tail_is_dropped() -> None:
    ts = _stream(103)
    rows = stream_rows(ts, batch_size=4)
    assert rows.ids.shape == (4, 25)  # 103 // 4 = 25, 3 tokens dropped
    np.testing.assert_array_equal(rows.ids.reshape(-1), ts.ids[:100])
    assert not rows.reversed_rows.any()
    # boundaries: positions where a new sentence starts inside the row
    for r in range(4):
        sent = ts.sentence_ids[25 * r : 25 * (r + 1)]
        expected = [p for p in range(1, 25) if sent[p] != sent[p - 1]]
        assert rows.boundaries[r].to_array().tolist() == expected


def test_bi_data_reverses_second_half_of_the_batch() -> None:
    ts = _stream(100)
    rows = stream_rows(ts, batch_size=4, bi_data=True)
    # two forward slices of 50 tokens, then the same two slices reversed
    assert rows.ids.shape == (4, 50)
    np.testing.assert_array_equal(rows.ids[0], ts.ids[:50])
    np.testing.assert_array_equal(rows.ids[1], ts.ids[50:100])
    np.testing.assert_array_equal(rows.ids[2], ts.ids[:50][::-1])
    np.testing.assert_array_equal(rows.ids[3], ts.ids[50:100][::-1])
    # the reversed row's boundaries are those of its reversed sentence ids, looked up lazily
    sent = ts.sentence_ids[:50][::-1]
    expected = [p for p in range(1, 50) if sent[p] != sent[p - 1]]
    assert rows.boundaries[2].to_array().tolist() == expected
    assert [rows.boundaries[2].search(x, side) for x in range(51) for side in ("left", "right")] == [
        int(np.searchsorted(expected, x, side=side)) for x in range(51) for side in ("left", "right")
    ]
    assert rows.reversed_rows.tolist() == [False, False, True, True]


def test_bi_data_needs_an_even_batch() -> None:
    with pytest.raises(ValueError, match="even batch_size"):
        stream_rows(_stream(100), batch_size=3, bi_data=True)


@pytest.mark.parametrize("bi_data", [False, True])
def test_ranks_get_disjoint_slices_of_the_global_layout(bi_data: bool) -> None:
    ts = _stream(240)
    world = 3
    per_rank = [
        stream_rows(ts, batch_size=4, bi_data=bi_data, rank=k, world_size=world) for k in range(world)
    ]
    n_fwd = 6 if bi_data else 12
    slices = ts.ids[: (240 // n_fwd) * n_fwd].reshape(n_fwd, -1)
    seen: set[int] = set()
    for k, rows in enumerate(per_rank):
        fwd = rows.ids[:2] if bi_data else rows.ids
        np.testing.assert_array_equal(fwd, slices[k * len(fwd) : (k + 1) * len(fwd)])
        if bi_data:
            np.testing.assert_array_equal(rows.ids[2:], fwd[:, ::-1])
        tokens = set(fwd.reshape(-1).tolist())
        assert not tokens & seen, "two ranks share a stream"
        seen |= tokens
    assert len({rows.stream_len for rows in per_rank}) == 1  # same number of batches on every rank


def test_rank_out_of_range() -> None:
    with pytest.raises(ValueError, match="rank"):
        stream_rows(_stream(100), batch_size=2, rank=2, world_size=2)


# -- segments A and B -----------------------------------------------------------------------------------


def _boundaries(sentence_len: int, data_len: int) -> np.ndarray:
    return np.arange(sentence_len, data_len, sentence_len)


def test_split_returns_none_past_the_end() -> None:
    rng = np.random.default_rng(0)
    assert split_a_and_b(50, _boundaries(5, 50), begin=40, tot_len=10, rng=rng) is None
    assert split_a_and_b(50, _boundaries(5, 50), begin=39, tot_len=10, rng=rng) is not None


def test_split_continuation_and_random_b() -> None:
    data_len, tot_len, begin = 200, 12, 40
    bounds = _boundaries(5, data_len)  # sentences [0,5), [5,10), ...
    rng = np.random.default_rng(1)
    pairs = [split_a_and_b(data_len, bounds, begin, tot_len, rng) for _ in range(400)]
    n_next = 0
    for p in pairs:
        assert p is not None
        assert p.a_begin == begin and p.a_len + p.b_len == tot_len and p.a_len >= 1 and p.b_len >= 1
        # B always starts on a sentence boundary (only right ends are trimmed)
        assert p.b_begin == 0 or p.b_begin in bounds
        if p.is_next:
            n_next += 1
            # A ended on a cut point inside (begin, begin + tot_len) and B starts there
            assert p.b_begin in (45, 50) and p.b_begin >= p.a_end
        else:
            assert p.b_end <= data_len - 1
    assert 0.4 < n_next / len(pairs) < 0.6


def test_split_hand_checked_continuation() -> None:
    """begin 40, tot_len 12, sentences every 5: cut points 45 and 50, B ends at boundary 55 (>= 52)."""
    bounds = _boundaries(5, 200)
    for seed in range(50):
        p = split_a_and_b(200, bounds, 40, 12, np.random.default_rng(seed))
        assert p is not None
        if p.is_next and p.b_begin == 45:  # A=[40,45) B=[45,55): 15 > 12, trim B (the longer) to 7
            assert (p.a_begin, p.a_end, p.b_begin, p.b_end) == (40, 45, 45, 52)
        if p.is_next and p.b_begin == 50:  # A=[40,50) B=[50,55): trim A to 7
            assert (p.a_begin, p.a_end, p.b_begin, p.b_end) == (40, 47, 50, 55)


def test_split_without_cut_points_always_draws_a_random_b() -> None:
    bounds = np.array([10, 100])  # one long sentence covers [10, 100)
    rng = np.random.default_rng(2)
    for _ in range(50):
        p = split_a_and_b(150, bounds, begin=20, tot_len=12, rng=rng)
        assert p is not None and not p.is_next
        assert p.a_len + p.b_len == 12 and p.b_begin in (0, 10, 100)


def test_example_layout_and_segment_ids() -> None:
    row = np.arange(100, 160)
    pair = SegmentPair(a_begin=8, a_end=11, b_begin=30, b_end=32, is_next=False)
    ids, seg = assemble_example(row, start=4, reuse_len=4, pair=pair)
    assert ids.tolist() == [104, 105, 106, 107, 108, 109, 110, SEP_ID, 130, 131, SEP_ID, CLS_ID]
    # reuse + A + first <sep> = 0, B + second <sep> = 1, <cls> = 2
    assert seg.tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2]
    assert ids.dtype == np.int64 and seg.dtype == np.int64
