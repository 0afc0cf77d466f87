"""Span-based targets and permutation masks (train.data.spans / train.data.permutation)."""

from __future__ import annotations

import numpy as np
import pytest

from train.data import (
    CLS_ID,
    SEP_ID,
    content_stream_can_see,
    example_permutation,
    query_stream_can_see,
    sample_span_mask,
    target_arrays,
)
from train.data.permutation import local_permutation_ranks, perm_mask_from_ranks
from train.data.spans import span_length_probs

# -- hand-checked permutation masks ---------------------------------------------------------------------


def test_perm_mask_hand_checked_single_part() -> None:
    """Five positions: plain 0 and 2, targets 1 (rank 4) and 3 (rank 1), <sep> at 4 (rank 3)."""
    rank = np.array([2, 4, 0, 1, 3])
    is_masked = np.array([0, 1, 0, 1, 0], dtype=bool)
    is_functional = np.array([0, 0, 0, 0, 1], dtype=bool)
    perm_mask, is_target = perm_mask_from_ranks(rank, is_masked, is_functional)
    assert is_target.tolist() == [False, True, False, True, False]
    # 1 = may not attend. Rows: who looks; columns: at whom.
    expected = np.array(
        [
            [0, 1, 0, 1, 1],  # plain: sees plain tokens only
            [0, 1, 0, 0, 0],  # target rank 4: sees plain, target rank 1, <sep> rank 3; not itself
            [0, 1, 0, 1, 1],  # plain
            [0, 1, 0, 1, 1],  # target rank 1: first in the order -> plain tokens only
            [0, 1, 0, 0, 0],  # <sep> rank 3: plain, target rank 1 and itself; not target rank 4
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(perm_mask, expected)

    query = query_stream_can_see(perm_mask.astype(np.float32))
    content = content_stream_can_see(perm_mask.astype(np.float32))
    assert query[1].tolist() == [True, False, True, True, True]
    assert content[1].tolist() == [True, True, True, True, True]  # the content stream sees itself
    assert query[3].tolist() == [True, False, True, False, False]
    assert content[3].tolist() == [True, False, True, True, False]
    np.testing.assert_array_equal(content[[0, 2, 4]], query[[0, 2, 4]])  # non-targets already see self


def test_example_permutation_hand_checked_reuse_boundary() -> None:
    """reuse part [x, t] + rest [t, sep, x, sep, cls, x]; fixed ranks; checks the cross-part blocks."""
    ids = np.array([10, 11, 12, SEP_ID, 13, SEP_ID, CLS_ID, 14])
    is_masked = np.array([0, 1, 1, 0, 0, 0, 0, 0], dtype=bool)
    ranks = (np.array([1, 0]), np.array([0, 1, 2, 3, 4, 5]))
    perm = example_permutation(ids, is_masked, reuse_len=2, perm_size=2, rng=None, ranks=ranks)  # type: ignore[arg-type]
    pm = perm.perm_mask.astype(int)
    assert perm.perm_mask.dtype == np.float32
    assert perm.is_target.tolist() == [False, True, True, False, False, False, False, False]
    # the reuse part cannot see the rest
    assert (pm[:2, 2:] == 1).all()
    # the rest sees the whole reuse part, including its target
    assert (pm[2:, :2] == 0).all()
    # reuse part: 0 plain, 1 target -> plain sees plain only, target sees plain not itself
    assert pm[:2, :2].tolist() == [[0, 1], [0, 1]]
    # rest: target 2 (rank 0); <sep> 3 (rank 1); plain 4; <sep> 5 (rank 3); <cls> 6 (rank 4); plain 7
    assert pm[2, 2:].tolist() == [1, 1, 0, 1, 1, 0]
    assert pm[3, 2:].tolist() == [0, 0, 0, 1, 1, 0]
    assert pm[4, 2:].tolist() == [1, 1, 0, 1, 1, 0]
    assert pm[6, 2:].tolist() == [0, 0, 0, 0, 0, 0]


def test_local_permutation_ranks_tile_blocks_with_one_shared_permutation() -> None:
    rank = local_permutation_ranks(12, 4, np.random.default_rng(3))
    blocks = rank.reshape(3, 4)
    for b in range(3):
        assert sorted(blocks[b].tolist()) == list(range(4 * b, 4 * b + 4))  # blocks keep their order
    np.testing.assert_array_equal(blocks - blocks[:, :1], np.broadcast_to(blocks[0] - blocks[0, 0], (3, 4)))
    with pytest.raises(ValueError, match="divide"):
        local_permutation_ranks(10, 4, np.random.default_rng(0))


def _random_example(seed: int, seq_len: int = 24, reuse_len: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 50, size=seq_len)
    a_end = reuse_len + int(rng.integers(1, seq_len - reuse_len - 4))
    ids[a_end] = SEP_ID
    ids[-2:] = [SEP_ID, CLS_ID]
    is_masked = rng.random(seq_len) < 0.3
    return ids, is_masked


@pytest.mark.parametrize("seed", range(20))
def test_permutation_rules_on_random_examples(seed: int) -> None:
    reuse_len, perm_size = 8, 4
    ids, is_masked = _random_example(seed)
    perm = example_permutation(ids, is_masked, reuse_len, perm_size, np.random.default_rng(seed))
    pm, tgt, rank = perm.perm_mask.astype(bool), perm.is_target, perm.rank
    func = (ids == SEP_ID) | (ids == CLS_ID)
    plain = ~tgt & ~func
    part = np.arange(len(ids)) >= reuse_len
    assert not (tgt & func).any()
    np.testing.assert_array_equal(tgt, is_masked & ~func)
    assert pm[~part][:, part].all()  # the reuse part cannot see the rest
    for i in range(len(ids)):
        for j in range(len(ids)):
            same = part[i] == part[j]
            if plain[j] and (same or part[i]):
                assert not pm[i, j], "plain tokens are seen by all (that may see their part)"
            if plain[i] and not plain[j] and same:
                assert pm[i, j], "plain tokens see no target and no functional token"
            if tgt[i] and tgt[j] and same:
                # a target sees exactly the targets before it in the factorisation order
                assert pm[i, j] == (rank[j] >= rank[i])
    assert all(pm[i, i] for i in np.flatnonzero(tgt))  # never itself (query stream)
    content = content_stream_can_see(perm.perm_mask)
    assert content.diagonal().all()


def test_target_arrays_one_hot_and_padding() -> None:
    ids = np.array([10, 11, 12, 13, 14])
    is_target = np.array([0, 1, 0, 1, 0], dtype=bool)
    mapping, target_ids, weights = target_arrays(ids, is_target, num_predict=3)
    assert mapping.dtype == np.float32 and target_ids.dtype == np.int64 and weights.dtype == np.float32
    assert mapping.tolist() == [[0, 1, 0, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]
    assert target_ids.tolist() == [11, 13, 0]
    assert weights.tolist() == [1, 1, 0]


# -- spans -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_spans_start_on_word_starts_and_count_is_exact(seed: int, reverse: bool) -> None:
    rng = np.random.default_rng(seed)
    seg_len, goal = 120, 20
    word_start = rng.random(seg_len) < 0.5
    eligible = np.ones(seg_len, dtype=bool)
    eligible[[30, 31, 119]] = False  # e.g. <sep>, <sep>, <cls>
    out = sample_span_mask(word_start, goal, rng, reverse=reverse, eligible=eligible)
    assert out.mask.sum() == goal
    assert not out.mask[~eligible].any()
    assert out.spans, "spans are sampled before any fill-up"
    covered = np.zeros(seg_len, dtype=bool)
    for beg, end in out.spans:
        assert 1 <= end - beg <= 5
        first = end - 1 if reverse else beg  # the span starts on a word start in reading order
        assert word_start[first]
        assert not covered[beg:end].any()
        covered[beg:end] = True
    assert out.mask[covered].all()
    assert out.mask.sum() - covered.sum() == out.num_filled


def test_span_lengths_follow_inverse_n() -> None:
    """With every token a word start and no goal, span lengths are drawn with p(n) ∝ 1/n."""
    rng = np.random.default_rng(1234)
    out = sample_span_mask(np.ones(100_000, dtype=bool), None, rng, max_gram=5)
    lengths = np.array([end - beg for beg, end in out.spans])
    assert len(lengths) > 5000
    freq = np.bincount(lengths, minlength=6)[1:] / len(lengths)
    np.testing.assert_allclose(freq, span_length_probs(5), atol=0.02)
    assert freq[0] > freq[1] > freq[2] > freq[3] > freq[4]
    # about mask_beta out of every mask_alpha + mask_beta tokens are predicted (1/7 by default)
    assert 0.12 < out.mask.mean() < 0.16
    assert out.num_filled == 0


def test_mask_alpha_beta_set_the_density() -> None:
    rng = np.random.default_rng(5)
    dense = sample_span_mask(np.ones(20_000, dtype=bool), None, rng, mask_alpha=2, mask_beta=1)
    assert 0.30 < dense.mask.mean() < 0.36  # 1 / (2 + 1)


def test_fill_up_with_single_tokens_when_spans_fall_short() -> None:
    rng = np.random.default_rng(7)
    word_start = np.zeros(40, dtype=bool)
    word_start[0] = True  # only one word start -> at most one span
    out = sample_span_mask(word_start, 25, rng)
    assert out.mask.sum() == 25
    assert len(out.spans) <= 1 and out.num_filled >= 20


def test_goal_larger_than_eligible_tokens_masks_all_of_them() -> None:
    eligible = np.array([1, 0, 1, 1, 0, 1], dtype=bool)
    out = sample_span_mask(np.ones(6, dtype=bool), 10, np.random.default_rng(0), eligible=eligible)
    np.testing.assert_array_equal(out.mask, eligible)


def test_spans_never_reach_the_last_token() -> None:
    rng = np.random.default_rng(11)
    for _ in range(200):
        out = sample_span_mask(np.ones(12, dtype=bool), None, rng)
        assert all(end < 12 for _, end in out.spans)
