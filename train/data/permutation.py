"""Factorisation orders and the attention masks they imply (`_local_perm` of the original).

Convention (same as the original and Hugging Face's XLNet): `perm_mask[i, j] = 1` means position `i`
may NOT attend to position `j`; 0 means it may. It is the mask of the *query* stream; the *content*
stream additionally lets every position see itself (see `content_stream_can_see`).

Within one part (the reuse part, or the rest) of an example:
- a permutation `rank` of the positions is drawn locally: the part is tiled into blocks of `perm_size`
  positions, the blocks keep their order and one random permutation of `0..perm_size-1` orders the
  positions inside every block (the original shuffles the rows of the `[perm_size, n_blocks]` index
  matrix, so all blocks share it);
- plain tokens that are not targets get rank -1: they come first in the factorisation order, so they
  are seen by every position and see no target (no leak);
- targets and the functional tokens `<sep>`/`<cls>` keep their rank: a target sees the plain tokens and
  the targets/functional tokens ranked before it, never itself; a functional token sees the same plus
  itself. `<sep>`/`<cls>` are never targets. (The original does exactly this; functional tokens are
  *not* moved to the front.)
Across parts: the reuse part cannot see the rest; the rest sees the whole reuse part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qa_core.contract import CLS_ID, SEP_ID


def local_permutation_ranks(length: int, perm_size: int, rng: np.random.Generator) -> np.ndarray:
    """int64 [length]: `rank[p]` is the place of position `p` in the factorisation order."""
    if length % perm_size:
        raise ValueError(f"perm_size ({perm_size}) must divide the part length ({length})")
    inner = rng.permutation(perm_size)
    blocks = np.arange(length // perm_size, dtype=np.int64)[:, None] * perm_size
    return (blocks + inner[None, :]).reshape(-1)


def perm_mask_from_ranks(
    rank: np.ndarray, is_masked: np.ndarray, is_functional: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The original's mask algebra for one part. Returns (perm_mask bool [L, L], is_target bool [L]).

    `perm_mask[i, j]` is True (i may not see j) iff j is a target or functional token and
    rank(j) >= rank(i) for targets i, rank(j) > rank(i) for functional i; plain tokens i see no
    target/functional token at all.
    """
    plain = ~is_masked & ~is_functional
    masked_or_func = ~plain
    rev_rank = np.where(plain, -1, rank)
    is_target = masked_or_func & ~is_functional
    self_rev_rank = np.where(is_target, rev_rank, rev_rank + 1)
    perm_mask = (self_rev_rank[:, None] <= rev_rank[None, :]) & masked_or_func[None, :]
    return perm_mask, is_target


@dataclass(frozen=True)
class ExamplePermutation:
    """perm_mask: float32 [T, T] (1 = may not attend); is_target: bool [T]; rank: int64 [T], the
    factorisation order used (within each part; the reuse part as a whole precedes the rest)."""

    perm_mask: np.ndarray
    is_target: np.ndarray
    rank: np.ndarray


def example_permutation(
    input_ids: np.ndarray,
    is_masked: np.ndarray,
    reuse_len: int,
    perm_size: int,
    rng: np.random.Generator,
    *,
    ranks: tuple[np.ndarray, np.ndarray] | None = None,
) -> ExamplePermutation:
    """Permute the reuse part and the rest separately and join their masks (the original's parser).

    `ranks` overrides the random orders (reuse part, rest), for hand-checked tests.
    """
    seq_len = int(input_ids.shape[0])
    is_functional = (input_ids == SEP_ID) | (input_ids == CLS_ID)
    parts = [slice(0, reuse_len), slice(reuse_len, seq_len)]
    perm_mask = np.ones((seq_len, seq_len), dtype=bool)
    perm_mask[reuse_len:, :reuse_len] = False  # the rest sees the whole reuse part
    is_target = np.zeros(seq_len, dtype=bool)
    rank = np.zeros(seq_len, dtype=np.int64)
    for k, part in enumerate(parts):
        length = part.stop - part.start
        r = local_permutation_ranks(length, perm_size, rng) if ranks is None else np.asarray(ranks[k])
        pm, tgt = perm_mask_from_ranks(r, is_masked[part], is_functional[part])
        perm_mask[part, part] = pm
        is_target[part] = tgt
        rank[part] = r
    return ExamplePermutation(perm_mask=perm_mask.astype(np.float32), is_target=is_target, rank=rank)


def target_arrays(
    input_ids: np.ndarray, is_target: np.ndarray, num_predict: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target_mapping float32 [P, T], target_ids int64 [P], target_weights float32 [P]).

    Row `k` of `target_mapping` is one-hot on the k-th target position (ascending positions); its
    label is the token itself (`target_ids[k] = input_ids[pos]`, the PLM objective). Rows past the
    number of targets are all zero with weight 0.
    """
    positions = np.flatnonzero(is_target)[:num_predict]
    seq_len = int(input_ids.shape[0])
    mapping = np.zeros((num_predict, seq_len), dtype=np.float32)
    mapping[np.arange(len(positions)), positions] = 1.0
    target_ids = np.zeros(num_predict, dtype=np.int64)
    target_ids[: len(positions)] = input_ids[positions]
    weights = np.zeros(num_predict, dtype=np.float32)
    weights[: len(positions)] = 1.0
    return mapping, target_ids, weights


def query_stream_can_see(perm_mask: np.ndarray) -> np.ndarray:
    """bool [..., T, T]: what the query stream at `i` may attend to (the perm_mask as is)."""
    return perm_mask == 0


def content_stream_can_see(perm_mask: np.ndarray) -> np.ndarray:
    """bool [..., T, T]: the content stream at `i` may also attend to itself (the diagonal)."""
    eye = np.eye(perm_mask.shape[-1], dtype=bool)
    return (perm_mask == 0) | eye
