"""Batches for XLNet pretraining: streams -> examples -> span targets -> permutation masks.

Stepping (as `create_tfrecords` in the original): every stream keeps a position `i` (the same for all
rows). The example at `i` is

    reuse = row[i : i + reuse_len]  +  A + <sep> + B + <sep> + <cls>,   A starting at i + reuse_len,

and after each batch `i += reuse_len`, whatever A and B were (the original ignores `new_begin`, also
when B was a random segment). So the reuse part of the next example, `row[i + reuse_len : i +
2 * reuse_len]`, starts exactly where this example's reuse part ends: a model that caches the hidden
states of the first `reuse_len` positions of each example as memory (`mem_len` long) always has the
real preceding text of the stream in its memory. Consecutive batches therefore must be consumed in
order, row `r` of every batch continuing row `r` of the previous one. A pass ends when
`i + seq_len > stream_len`; the next pass restarts every stream at 0 with fresh random choices.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from qa_core.contract import CLS_ID, SEP_ID
from train.data.config import PretrainDataConfig
from train.data.permutation import example_permutation, target_arrays
from train.data.rows import Corpus
from train.data.segments import assemble_example, split_a_and_b
from train.data.spans import sample_span_mask
from train.data.streams import TokenStream, as_corpus, num_forward_streams, stream_rows, tokenize_documents

STATE_VERSION = 1


class Tokenizer(Protocol):
    @property
    def word_start_table(self) -> np.ndarray: ...

    def encode(self, text: str) -> list[int]: ...


def batches_per_pass(stream_len: int, seq_len: int, reuse_len: int) -> int:
    """Number of positions `i = 0, reuse_len, 2 * reuse_len, ...` with `i + seq_len <= stream_len`."""
    if stream_len < seq_len:
        return 0
    return (stream_len - seq_len) // reuse_len + 1


class PretrainBatches(Iterator[dict[str, np.ndarray]]):
    """Deterministic, resumable iterator over pretraining batches of one rank.

    Each batch is a dict of numpy arrays (B = config.batch_size, T = seq_len, P = num_predict):
      input_ids       int64   [B, T]
      token_type_ids  int64   [B, T]     0 = reuse + A + first <sep>, 1 = B + second <sep>, 2 = <cls>
      perm_mask       float32 [B, T, T]  1 = position i may NOT attend to j (query stream)
      target_mapping  float32 [B, P, T]  one-hot rows on the target positions; padding rows all zero
      target_ids      int64   [B, P]     the token at each target position (0 for padding)
      target_weights  float32 [B, P]     1 for real targets, 0 for padding
      input_q         float32 [B, T]     1 at target positions (the original's `input_q`)
      is_continuation int64   [B]        1 if B is the real continuation of A
    With `bi_data`, rows `B//2 ..` read their streams backwards.

    `state_dict()` captures the stream position, the pass and the numpy Generator state; after
    `load_state_dict()` the next batches are bit-identical to those an uninterrupted run would give.
    """

    def __init__(
        self,
        stream: TokenStream | Corpus,
        word_start_table: np.ndarray,
        config: PretrainDataConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        passes: int | None = None,
    ) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.passes = passes
        self.word_start_table = np.asarray(word_start_table, dtype=bool)
        corpus = as_corpus(stream)
        max_id = corpus.max_id()
        if max_id >= len(self.word_start_table):
            raise ValueError(
                f"token id {max_id} is outside word_start_table (size "
                f"{len(self.word_start_table)}): tokenizer and token stream do not match"
            )
        n_fwd = num_forward_streams(config.batch_size, world_size, config.bi_data)
        stream_len = len(corpus) // n_fwd
        if batches_per_pass(stream_len, config.seq_len, config.reuse_len) == 0:
            raise ValueError(
                f"corpus too small: {len(corpus)} tokens cut into {n_fwd} streams (batch_size="
                f"{config.batch_size} x world_size={world_size}{', halved by bi_data' if config.bi_data else ''}) "
                f"gives {stream_len} tokens per stream, but one example needs seq_len={config.seq_len}; "
                "use more text, a smaller batch_size or a shorter seq_len"
            )
        self.rows = stream_rows(
            corpus, config.batch_size, bi_data=config.bi_data, rank=rank, world_size=world_size
        )
        self.num_batches_per_pass = batches_per_pass(self.rows.stream_len, config.seq_len, config.reuse_len)
        self._num_tokens = len(corpus)
        self._rng = np.random.default_rng(np.random.SeedSequence([config.seed, rank]))
        self._pass = 0
        self._position = 0

    # -- construction helpers -------------------------------------------------------------------------
    @classmethod
    def from_documents(
        cls,
        documents: Iterable[Sequence[str]],
        tokenizer: Tokenizer,
        config: PretrainDataConfig,
        **kwargs: Any,
    ) -> PretrainBatches:
        stream = tokenize_documents(documents, tokenizer.encode)
        return cls(stream, tokenizer.word_start_table, config, **kwargs)

    @classmethod
    def from_files(
        cls, paths: Sequence[str | Path], tokenizer: Tokenizer, config: PretrainDataConfig, **kwargs: Any
    ) -> PretrainBatches:
        """Plain text or SQuAD JSON files, read by `train.common.corpus.read_documents`."""
        from train.common.corpus import read_documents

        return cls.from_documents(read_documents(paths), tokenizer, config, **kwargs)

    # -- iteration ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches in one pass over the streams."""
        return self.num_batches_per_pass

    @property
    def num_tokens(self) -> int:
        """Tokens in the whole corpus (all ranks)."""
        return self._num_tokens

    @property
    def pass_index(self) -> int:
        return self._pass

    @property
    def step_in_pass(self) -> int:
        """Index of the next batch within the current pass (0: streams restart, memory is stale)."""
        return self._position // self.config.reuse_len

    def __iter__(self) -> PretrainBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.passes is not None and self._pass >= self.passes:
            raise StopIteration
        batch = self._make_batch(self._position)
        self._position += self.config.reuse_len
        if self._position // self.config.reuse_len >= self.num_batches_per_pass:
            # wrap right away, so `step_in_pass == 0` announces the restart before the next batch
            self._pass += 1
            self._position = 0
        return batch

    def _make_batch(self, i: int) -> dict[str, np.ndarray]:
        cfg = self.config
        bsz, seq_len, num_predict = cfg.batch_size, cfg.seq_len, cfg.num_predict
        assert num_predict is not None and cfg.perm_size is not None
        out: dict[str, np.ndarray] = {
            "input_ids": np.zeros((bsz, seq_len), dtype=np.int64),
            "token_type_ids": np.zeros((bsz, seq_len), dtype=np.int64),
            "perm_mask": np.zeros((bsz, seq_len, seq_len), dtype=np.float32),
            "target_mapping": np.zeros((bsz, num_predict, seq_len), dtype=np.float32),
            "target_ids": np.zeros((bsz, num_predict), dtype=np.int64),
            "target_weights": np.zeros((bsz, num_predict), dtype=np.float32),
            "input_q": np.zeros((bsz, seq_len), dtype=np.float32),
            "is_continuation": np.zeros(bsz, dtype=np.int64),
        }
        rng = self._rng
        for r in range(bsz):
            row = self.rows.rows[r]
            pair = split_a_and_b(
                self.rows.stream_len, self.rows.boundaries[r], i + cfg.reuse_len, cfg.ab_len, rng
            )
            assert pair is not None, "batches_per_pass guarantees room for every example"
            ids, seg = assemble_example(row, i, cfg.reuse_len, pair)
            reverse = bool(self.rows.reversed_rows[r])
            word_start = self.word_start_table[ids]
            eligible = (ids != SEP_ID) & (ids != CLS_ID)
            is_masked = np.zeros(seq_len, dtype=bool)
            for part, goal in (
                (slice(0, cfg.reuse_len), cfg.num_predict_reuse),
                (slice(cfg.reuse_len, seq_len), cfg.num_predict_rest),
            ):
                is_masked[part] = sample_span_mask(
                    word_start[part],
                    goal,
                    rng,
                    max_gram=cfg.max_gram,
                    mask_alpha=cfg.mask_alpha,
                    mask_beta=cfg.mask_beta,
                    reverse=reverse,
                    eligible=eligible[part],
                ).mask
            perm = example_permutation(ids, is_masked, cfg.reuse_len, cfg.perm_size, rng)
            mapping, target_ids, weights = target_arrays(ids, perm.is_target, num_predict)
            out["input_ids"][r] = ids
            out["token_type_ids"][r] = seg
            out["perm_mask"][r] = perm.perm_mask
            out["target_mapping"][r] = mapping
            out["target_ids"][r] = target_ids
            out["target_weights"][r] = weights
            out["input_q"][r] = perm.is_target
            out["is_continuation"][r] = int(pair.is_next)
        return out

    # -- checkpointing ------------------------------------------------------------------------------
    def _layout(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "seq_len": cfg.seq_len,
            "reuse_len": cfg.reuse_len,
            "batch_size": cfg.batch_size,
            "bi_data": cfg.bi_data,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_tokens": self._num_tokens,
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain Python data (ints, strs, dicts): safe for `torch.save`/`json`."""
        return {
            "version": STATE_VERSION,
            "pass": self._pass,
            "position": self._position,
            "rng": self._rng.bit_generator.state,
            "layout": self._layout(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported data state version {state.get('version')!r}")
        if state["layout"] != self._layout():
            raise ValueError(
                f"data state was saved for a different stream layout: {state['layout']} != {self._layout()} "
                "(same corpus, seq_len, reuse_len, batch_size, bi_data, rank and world_size are needed)"
            )
        self._pass = int(state["pass"])
        self._position = int(state["position"])
        self._rng.bit_generator.state = state["rng"]
