"""Pretraining data pinned against small reference re-implementations of the original XLNet
(data_utils.py): the example layout, the permutation, span sampling and the A/B segment split.

Each ``_orig_*`` function is a reference in numpy / plain Python: how they are written, and the list
of points with their tests, are in docs/recipe.md ("Points the review found matching").

Where the original samples, the reference and our code each read an identically seeded numpy Generator,
and the reference makes exactly one Generator call per random call of the original, in the original's
order: a uniform float for ``random.random()``; an integer below ``len(xs)`` for ``random.choice(xs)``;
an integer in ``[a, b]`` for ``random.randint(a, b)``; an integer below ``n`` for ``np.random.choice(n)``;
and for ``np.random.choice(a, p=p)`` one uniform float looked up in the cumulative ``p`` (how numpy's
legacy ``choice`` samples). Sampled spans and segments can therefore be compared exactly.
"""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
from paths import SAMPLE_CORPUS

from qa_core.contract import CLS_ID, SEP_ID
from qa_core.tokenizer import SPIECE_UNDERLINE, XLNetTokenizer
from train.data.permutation import example_permutation, local_permutation_ranks, target_arrays
from train.data.segments import SegmentPair, assemble_example, split_a_and_b
from train.data.spans import sample_span_mask

# =====================================================================================================
# Pretraining data: data_utils.py create_tfrecords layout, _local_perm + parser, _sample_mask,
# _split_a_and_b
# =====================================================================================================


def _orig_perm_ranks(n: int, perm_size: int, shuffle: np.ndarray) -> np.ndarray:
    """The factorization order of data_utils.py _local_perm as a rank per position. The ``n``
    positions (a multiple of ``perm_size``) form consecutive blocks of ``perm_size``, all permuted the
    same way: the original shuffles the rows of one [perm_size, n / perm_size] index
    (tf.random_shuffle), and ``shuffle`` is that row order. Position ``b * perm_size + r`` thus gets
    rank ``b * perm_size + shuffle[r]``."""
    offset = np.arange(n) % perm_size
    return np.arange(n) - offset + np.asarray(shuffle)[offset]


def _orig_parser(inputs, target, is_masked, reuse_len, perm_size, num_predict, shuffles):
    """The arrays data_utils.py get_dataset's parser (with _local_perm) makes from one example's inputs,
    next-token targets and is_masked. Facts encoded:

    - the reuse part ``[:reuse_len]`` and the rest are ordered separately: ranks from
      ``_orig_perm_ranks`` with ``shuffles[0]`` and ``shuffles[1]``, each part counting from 0;
    - a position is hidden if it is masked or is <sep>/<cls>, and a target if it is masked and not
      <sep>/<cls> (``input_q`` is the target flag); an unhidden position has order -1, a hidden one its
      rank;
    - within a part, ``perm_mask[i, j]`` (1 = i may not attend to j) holds when j is hidden and comes
      later in the order than i, or when j is i and i is a target; across parts, the reuse part's rows
      are blocked from all of the rest, and the rest's rows see all of the reuse part;
    - a position's label is the previous position's target within its part (its own token, for
      next-token targets); a part's first position takes its own input;
    - target_mapping: one one-hot row per target position in increasing order, then zero rows up to
      ``num_predict``; their labels follow, padded with 0; weights 1 for real rows, 0 for padding.
    """
    n = len(inputs)
    inputs, is_masked = np.asarray(inputs), np.asarray(is_masked, dtype=bool)
    first_of_part = [p for p in (0, reuse_len) if p < n]
    rank = np.concatenate(
        [_orig_perm_ranks(k, perm_size, s) for k, s in zip((reuse_len, n - reuse_len), shuffles, strict=True)]
    )
    special = np.isin(inputs, [SEP_ID, CLS_ID])
    hidden = is_masked | special
    is_target = is_masked & ~special
    order = np.where(hidden, rank, -1)
    within = hidden[None, :] & (
        (order[None, :] > order[:, None]) | (np.eye(n, dtype=bool) & is_target[:, None])
    )
    in_reuse = np.arange(n) < reuse_len
    same_part = in_reuse[:, None] == in_reuse[None, :]
    perm_mask = np.where(same_part, within, in_reuse[:, None]).astype(np.float32)

    labels = np.roll(np.asarray(target), 1)
    labels[first_of_part] = inputs[first_of_part]
    where = np.flatnonzero(is_target)
    mapping = np.zeros((num_predict, n))
    mapping[np.arange(len(where)), where] = 1
    pad = num_predict - len(where)
    return dict(
        perm_mask=perm_mask,
        target_mapping=mapping,
        target=np.concatenate([labels[where], np.zeros(pad, dtype=np.int64)]),
        target_weights=np.concatenate([np.ones(len(where)), np.zeros(pad)]),
        input_q=is_target.astype(np.float32),
        rank=rank,
    )


@pytest.mark.parametrize("seed", range(8))
def test_example_layout_and_permutation_match_the_original(seed: int) -> None:
    """create_tfrecords' reuse + A <sep> B <sep> <cls> layout and segment ids, and the parser's
    perm_mask / target_mapping / targets (the token itself) / input_q, for the same permutations."""
    rng = np.random.default_rng(seed)
    seq_len, reuse_len, perm_size, num_predict = 24, 8, 4, 12
    row = rng.integers(10, 60, size=200)
    tot_len = seq_len - reuse_len - 3
    a_len = int(rng.integers(1, tot_len))
    i = int(rng.integers(0, 40))
    a_begin = i + reuse_len
    b_begin = int(rng.integers(0, 150))
    pair = SegmentPair(a_begin, a_begin + a_len, b_begin, b_begin + tot_len - a_len, is_next=False)
    # The original's example: reuse part, A, <sep>, B, <sep>, <cls>; segment 0 up to and including the
    # first <sep>, 1 for B and the second <sep>, 2 for <cls>. Each target is the token that follows
    # in the stream: A's last token predicts the token after A, the first <sep> predicts B's first
    # token, B's last the token after B; the second <sep> and <cls> get <cls> targets
    # (data_utils.create_tfrecords with extend_target=True).
    reuse_part = row[i : i + reuse_len]
    seg_a = row[pair.a_begin : pair.a_end]
    seg_b = row[pair.b_begin : pair.b_end]
    expected_ids = np.concatenate([reuse_part, seg_a, [SEP_ID], seg_b, [SEP_ID], [CLS_ID]])
    expected_seg = [0] * (reuse_len + len(seg_a) + 1) + [1] * (len(seg_b) + 1) + [2]
    next_tokens = np.concatenate(
        [
            row[i + 1 : i + reuse_len + 1],
            row[pair.a_begin + 1 : pair.a_end + 1],
            row[pair.b_begin : pair.b_end + 1],
            [CLS_ID, CLS_ID],
        ]
    )
    assert len(expected_ids) == len(next_tokens) == seq_len

    ids, seg = assemble_example(row, i, reuse_len, pair)
    assert ids.tolist() == expected_ids.tolist() and seg.tolist() == expected_seg

    is_masked = rng.random(seq_len) < 0.4  # the original's masks may also cover <sep>/<cls>
    is_masked[-1] = True
    # our draws: the reuse part's permutation, then the rest's, from one Generator
    g = np.random.default_rng(100 + seed)
    shuffles = [g.permutation(perm_size), g.permutation(perm_size)]
    ref = _orig_parser(expected_ids, next_tokens, is_masked, reuse_len, perm_size, num_predict, shuffles)
    perm = example_permutation(ids, is_masked, reuse_len, perm_size, np.random.default_rng(100 + seed))
    np.testing.assert_array_equal(perm.rank, ref["rank"])
    np.testing.assert_array_equal(perm.perm_mask, ref["perm_mask"])
    np.testing.assert_array_equal(perm.is_target.astype(np.float32), ref["input_q"])
    mapping, target_ids, weights = target_arrays(ids, perm.is_target, num_predict)
    np.testing.assert_array_equal(mapping, ref["target_mapping"])
    np.testing.assert_array_equal(target_ids, ref["target"])
    np.testing.assert_array_equal(weights, ref["target_weights"])
    # the blocks of a longer part all share the one shuffle (tf.random_shuffle of the rows)
    g = np.random.default_rng(seed)
    ref_rank = _orig_perm_ranks(32, 4, g.permutation(4))
    np.testing.assert_array_equal(local_permutation_ranks(32, 4, np.random.default_rng(seed)), ref_rank)


# single-character pieces that start a word in data_utils.py _is_start_piece: ASCII punctuation except
# ' = > (absent from the original's list; "<" is covered by the prefix rule)
_WORD_START_PUNCTUATION = frozenset(string.punctuation) - set("'<=>")


def _orig_is_start_piece(piece: str) -> bool:
    """data_utils.py _is_start_piece: a piece starts a word when it begins with "▁" or "<" (control
    symbols), or is a single punctuation character of the original's list, which lacks ', = and >."""
    return piece[:1] in (SPIECE_UNDERLINE, "<") or piece in _WORD_START_PUNCTUATION


def _orig_sample_mask(pieces, rng, *, reverse, max_gram, goal_num_predict, mask_alpha, mask_beta):
    """data_utils.py _sample_mask up to, not including, its closing random single-token fill-up:
    (mask, spans in the input's coordinates in sampling order, number of tokens they cover).

    Facts encoded, for a cursor walking the pieces from the left (over the reversed pieces with
    ``reverse``, spans mapped back afterwards):

    - sampling stops once the goal (if any) is met or the cursor has left the sequence;
    - each span draws, in this order: n in 1..max_gram with P(n) proportional to 1/n (one uniform
      float looked up in the cumulative probabilities, as numpy's legacy ``choice(a, p=p)``), capped at
      what the goal still needs; then the left context, a uniform integer in [0, ctx), where the
      context size ``ctx = n * mask_alpha // mask_beta`` is rounded DOWN; the right context is the rest;
    - the span starts at the first word-start piece (``_orig_is_start_piece``) at or after cursor + left
      context, and is exactly n pieces long: the original's end-scan tests the start piece ``seg[beg]``
      (always a word start) instead of ``seg[end]``, so it counts pieces, not words, and a span may end
      mid-word;
    - sampling stops, without that span, when no word start is left or when the span would cover the
      last piece;
    - the cursor moves to the span's end plus the right context.
    """
    seg_len = len(pieces)
    walked = pieces[::-1] if reverse else pieces
    is_start = np.array([_orig_is_start_piece(p) for p in walked] + [True])  # sentinel at seg_len
    # first word start at or after each position (seg_len when there is none)
    next_start = np.minimum.accumulate(np.where(is_start, np.arange(seg_len + 1), seg_len)[::-1])[::-1]
    weights = 1.0 / np.arange(1, max_gram + 1)
    cdf = np.cumsum(weights / weights.sum())
    cdf /= cdf[-1]

    spans: list[tuple[int, int]] = []
    covered = cursor = 0
    while cursor < seg_len and (goal_num_predict is None or covered < goal_num_predict):
        n = 1 + int(np.searchsorted(cdf, rng.random(), side="right"))
        if goal_num_predict is not None:
            n = min(n, goal_num_predict - covered)
        ctx = n * mask_alpha // mask_beta
        left = int(rng.integers(ctx))
        beg = int(next_start[min(cursor + left, seg_len)])
        if beg + n >= seg_len:
            break
        spans.append((beg, beg + n))
        covered += n
        cursor = beg + n + ctx - left
    if reverse:
        spans = [(seg_len - end, seg_len - beg) for beg, end in spans]
    mask = np.zeros(seg_len, dtype=bool)
    for beg, end in spans:
        mask[beg:end] = True
    return mask, spans, covered


@pytest.fixture(scope="module")
def corpus_segments(xlnet_tok: XLNetTokenizer) -> list[tuple[np.ndarray, list[str]]]:
    """Real token segments (A <sep> B <sep> <cls>, ~130 tokens) from the sample corpus."""
    docs = json.loads(SAMPLE_CORPUS.read_text(encoding="utf-8"))
    texts = [json.dumps(docs)[k : k + 2000] for k in range(0, 40000, 5000)]
    segments = []
    for k, text in enumerate(texts):
        ids = xlnet_tok.encode(text)[: 120 + k]
        cut = len(ids) // 3
        seg = np.array([*ids[:cut], SEP_ID, *ids[cut:], SEP_ID, CLS_ID], dtype=np.int64)
        segments.append((seg, [xlnet_tok.id_to_piece(int(i)) for i in seg]))
    return segments


@pytest.mark.parametrize(("mask_alpha", "mask_beta"), [(6, 1), (4, 2), (3, 1)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("goal", [None, 20])
def test_span_sampling_matches_sample_mask(
    xlnet_tok: XLNetTokenizer, corpus_segments, mask_alpha: int, mask_beta: int, reverse: bool, goal
) -> None:
    """Same spans for the same draws: n ~ 1/n, context n * alpha // beta split at random, span start on
    the next word-start piece (_is_start_piece), the original's n-pieces end-scan, no span reaching
    the last token; with a goal, n is capped by what is left and the rest is filled with single tokens.
    (Ours fills up from other draws and only with eligible tokens, so only the count is compared.)"""
    for k, (ids, pieces) in enumerate(corpus_segments):
        ref_mask, ref_spans, ref_covered = _orig_sample_mask(
            pieces,
            np.random.default_rng(k),
            reverse=reverse,
            max_gram=5,
            goal_num_predict=goal,
            mask_alpha=mask_alpha,
            mask_beta=mask_beta,
        )
        ours = sample_span_mask(
            xlnet_tok.word_start_table[ids],
            goal,
            np.random.default_rng(k),
            max_gram=5,
            mask_alpha=mask_alpha,
            mask_beta=mask_beta,
            reverse=reverse,
        )
        assert ours.spans == ref_spans
        assert ref_spans
        if goal is None:
            np.testing.assert_array_equal(ours.mask, ref_mask)
        else:
            assert ours.mask[ref_mask].all() and ours.mask.sum() == goal
            assert ours.num_filled == goal - ref_covered


def test_span_context_size_with_a_non_integral_alpha_over_beta(
    xlnet_tok: XLNetTokenizer, corpus_segments
) -> None:
    for k, (ids, pieces) in enumerate(corpus_segments):
        ref = _orig_sample_mask(
            pieces,
            np.random.default_rng(k),
            reverse=False,
            max_gram=5,
            goal_num_predict=None,
            mask_alpha=7,
            mask_beta=3,
        )[1]
        ours = sample_span_mask(
            xlnet_tok.word_start_table[ids], None, np.random.default_rng(k), mask_alpha=7, mask_beta=3
        )
        assert ours.spans == ref


def test_word_starts_are_is_start_piece(xlnet_tok: XLNetTokenizer) -> None:
    expected = [_orig_is_start_piece(xlnet_tok.id_to_piece(i)) for i in range(xlnet_tok.vocab_size)]
    assert xlnet_tok.word_start_table.tolist() == expected


def _orig_split_a_and_b(data_len, sent_ids, begin_idx, tot_len, rng):
    """data_utils.py _split_a_and_b with extend_target=True, as index ranges:
    ``((a_begin, a_end, b_begin, b_end, is_next), extend_target_ok)``, or None when
    ``begin_idx + tot_len >= data_len``. Facts encoded (a sentence start is a position where sent_ids
    changes):

    - the cuts are the sentence starts after begin_idx and less than tot_len past it; the scan end is the
      first sentence start at least tot_len past it, or data_len;
    - A starts at begin_idx. Without cuts, B is random and A runs to the scan end, and no coin is drawn.
      With cuts, one uniform float < 0.5 picks a random B, otherwise the true continuation, and then one
      uniform integer picks A's end among the cuts;
    - a random B (is_next 0) has length ``max(1, tot_len - len(A))`` and a start drawn uniformly from
      ``[0, data_len - 1 - length]``, then widens back to its sentence's start and forward to the next
      sentence start, but not past ``data_len - 1``;
    - the true continuation (is_next 1) runs from A's end to the scan end;
    - while ``len(A) + len(B) > tot_len`` the longer one loses its last token, B on ties: this leaves A
      with ``max(tot_len - len(B), ceil(tot_len / 2))`` tokens if it had more, and B with the rest;
    - extend_target_ok: both ends lie below data_len (where not, the original returns None).
    """
    if begin_idx + tot_len >= data_len:
        return None
    sentence_starts = np.flatnonzero(sent_ids[1:data_len] != sent_ids[: data_len - 1]) + 1
    later = sentence_starts[sentence_starts > begin_idx]
    n_cuts = int(np.searchsorted(later, begin_idx + tot_len))
    cuts, scan_end = later[:n_cuts], int(later[n_cuts]) if n_cuts < len(later) else data_len

    is_next = n_cuts > 0 and rng.random() >= 0.5
    a_end = int(cuts[rng.integers(n_cuts)]) if n_cuts else scan_end
    if is_next:
        b_begin, b_end = a_end, scan_end
    else:
        b_len = max(1, tot_len - (a_end - begin_idx))
        b_begin = int(rng.integers(data_len - b_len))
        b_end = b_begin + b_len
        b_begin = int(sentence_starts[sentence_starts <= b_begin].max(initial=0))
        b_end = min(int(sentence_starts[sentence_starts >= b_end].min(initial=data_len)), data_len - 1)

    len_a, len_b = a_end - begin_idx, b_end - b_begin
    if len_a + len_b > tot_len:
        len_a = min(len_a, max(tot_len - len_b, (tot_len + 1) // 2))
        a_end, b_end = begin_idx + len_a, b_begin + tot_len - len_a
    return (begin_idx, a_end, b_begin, b_end, int(is_next)), a_end < data_len and b_end < data_len


@pytest.mark.parametrize("tot_len", [5, 13, 29, 61])
def test_segment_split_matches_split_a_and_b(tot_len: int) -> None:
    rng = np.random.default_rng(tot_len)
    lengths = np.append(rng.integers(1, 16, size=60), [90, 10])  # a random B may widen to the end
    sent_ids = np.repeat(np.arange(len(lengths)), lengths)
    data_len = len(sent_ids)
    boundaries = np.flatnonzero(sent_ids[1:] != sent_ids[:-1]) + 1
    n_checked = n_next = 0
    for seed in range(40):
        # the pipeline's begin = i + reuse_len with i + seq_len <= data_len, i.e. begin + tot_len + 3 <= data_len
        for begin in range(0, data_len - tot_len - 3 + 1, 7):
            ref = _orig_split_a_and_b(
                data_len, sent_ids, begin, tot_len, np.random.default_rng([seed, begin])
            )
            ours = split_a_and_b(data_len, boundaries, begin, tot_len, np.random.default_rng([seed, begin]))
            assert ref is not None and ours is not None
            (a0, a1, b0, b1, label), extend_ok = ref
            assert (ours.a_begin, ours.a_end, ours.b_begin, ours.b_end, int(ours.is_next)) == (
                a0,
                a1,
                b0,
                b1,
                label,
            )
            # (where extend_ok is False the original's create_tfrecords ends the pass instead: B reaches
            # the stream's last token and has no next-token target; ours keeps the example)
            assert extend_ok or b1 == data_len
            n_checked += 1
            n_next += label
    assert n_checked > 500 and 0 < n_next < n_checked
