"""PretrainBatches: layout, stepping, bi_data, determinism, resume, sharding, config errors, real corpus."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from paths import SAMPLE_CORPUS

from train.data import (
    CLS_ID,
    EOD_ID,
    SEP_ID,
    PretrainBatches,
    PretrainDataConfig,
    TokenStream,
    batches_per_pass,
    tokenize_documents,
)

VOCAB = 400

# Fake vocabulary: even ids >= 10 start a word, odd ids continue it; specials (< 10) are word starts.
WORD_START = np.zeros(VOCAB, dtype=bool)
WORD_START[:10] = True
WORD_START[10::2] = True


def _encode(text: str) -> list[int]:
    out: list[int] = []
    for w in text.split():
        k = int(w[1:])
        out.append(10 + 2 * k)
        if k % 3 == 0:
            out.append(11 + 2 * k)
    return out


def _stream(n_docs: int = 200, seed: int = 0) -> TokenStream:
    rng = np.random.default_rng(seed)
    docs = [
        [
            " ".join(f"w{rng.integers(150)}" for _ in range(rng.integers(3, 12)))
            for _ in range(rng.integers(1, 8))
        ]
        for _ in range(n_docs)
    ]
    return tokenize_documents(docs, _encode)


STREAM = _stream()
CFG = PretrainDataConfig(seq_len=32, reuse_len=16, batch_size=4, num_predict=6, perm_size=8, seed=3)


def _batches(cfg: PretrainDataConfig = CFG, stream: TokenStream = STREAM, **kwargs) -> PretrainBatches:
    return PretrainBatches(stream, WORD_START, cfg, **kwargs)


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_shapes_and_dtypes() -> None:
    batch = next(_batches())
    expected = {
        "input_ids": ((4, 32), np.int64),
        "token_type_ids": ((4, 32), np.int64),
        "perm_mask": ((4, 32, 32), np.float32),
        "target_mapping": ((4, 6, 32), np.float32),
        "target_ids": ((4, 6), np.int64),
        "target_weights": ((4, 6), np.float32),
        "input_q": ((4, 32), np.float32),
        "is_continuation": ((4,), np.int64),
    }
    assert set(batch) == set(expected)
    for key, (shape, dtype) in expected.items():
        assert batch[key].shape == shape and batch[key].dtype == dtype, key


def test_example_invariants() -> None:
    data = _batches(replace(CFG, bi_data=True))
    labels = []
    for _ in range(12):
        batch = next(data)
        labels += batch["is_continuation"].tolist()
        for r in range(4):
            ids, seg = batch["input_ids"][r], batch["token_type_ids"][r]
            # layout: reuse + A + <sep> (0) | B + <sep> (1) | <cls> (2)
            assert ids[-1] == CLS_ID and ids[-2] == SEP_ID and seg[-1] == 2 and seg[-2] == 1
            first_sep = 16 + int(np.flatnonzero(ids[16:] == SEP_ID)[0])
            assert (seg[: first_sep + 1] == 0).all() and (seg[first_sep + 1 : -1] == 1).all()
            assert first_sep > 16 and first_sep < 29  # A and B both non-empty
            # exactly num_predict targets, never <sep>/<cls>, labelled with the token itself
            mapping = batch["target_mapping"][r]
            assert (batch["target_weights"][r] == 1).all()
            assert (mapping.sum(axis=1) == 1).all()
            pos = mapping.argmax(axis=1)
            assert (np.diff(pos) > 0).all()
            assert not np.isin(ids[pos], [SEP_ID, CLS_ID]).any()
            np.testing.assert_array_equal(batch["target_ids"][r], ids[pos])
            np.testing.assert_array_equal(batch["input_q"][r], mapping.sum(axis=0))
            # the original splits num_predict: ceil half in the reuse part, floor half in the rest
            assert (pos < 16).sum() == 3 and (pos >= 16).sum() == 3
            pm = batch["perm_mask"][r]
            assert (pm[:16, 16:] == 1).all() and (pm[16:, :16] == 0).all()
            assert (pm[pos, pos] == 1).all()
    assert 0.3 < np.mean(labels) < 0.7


def test_streams_step_by_reuse_len_so_memory_holds_the_preceding_text() -> None:
    data = _batches()
    rows = data.rows.ids
    n = len(data)
    assert n == batches_per_pass(data.rows.stream_len, 32, 16) == (data.rows.stream_len - 32) // 16 + 1
    reuse_parts = []
    for t in range(n):
        assert data.step_in_pass == t and data.pass_index == 0
        batch = next(data)
        # reuse part = row[i : i + reuse_len] with i = t * reuse_len; A starts right after it
        np.testing.assert_array_equal(batch["input_ids"][:, :16], rows[:, 16 * t : 16 * (t + 1)])
        np.testing.assert_array_equal(batch["input_ids"][:, 16], rows[:, 16 * (t + 1)])
        reuse_parts.append(batch["input_ids"][:, :16])
    # consecutive reuse parts (what the model caches as memory) tile each stream without gaps
    np.testing.assert_array_equal(np.concatenate(reuse_parts, axis=1), rows[:, : 16 * n])
    # next pass: streams restart at 0 and `step_in_pass == 0` says so before the batch is drawn
    assert data.pass_index == 1 and data.step_in_pass == 0
    np.testing.assert_array_equal(next(data)["input_ids"][:, :16], rows[:, :16])


def test_passes_limit_stops_iteration() -> None:
    data = _batches(passes=1)
    assert sum(1 for _ in data) == len(data)


def test_bi_data_rows_read_the_streams_backwards() -> None:
    data = _batches(replace(CFG, bi_data=True))
    n_fwd = 2
    step = len(STREAM) // n_fwd
    fwd = STREAM.ids[: n_fwd * step].reshape(n_fwd, step)
    for t in range(3):
        batch = next(data)
        reuse = batch["input_ids"][:, :16]
        np.testing.assert_array_equal(reuse[:2], fwd[:, 16 * t : 16 * (t + 1)])
        np.testing.assert_array_equal(reuse[2:], fwd[:, ::-1][:, 16 * t : 16 * (t + 1)])


def test_same_seed_same_batches_other_seed_other_batches() -> None:
    a, b, c = _batches(), _batches(), _batches(replace(CFG, seed=4))
    for _ in range(3):
        x, y, z = next(a), next(b), next(c)
        assert _equal(x, y)
    assert not _equal(x, z)
    np.testing.assert_array_equal(x["input_ids"][:, :16], z["input_ids"][:, :16])  # same streams


@pytest.mark.parametrize("skip", [2, 9])  # mid-pass, and across the end of a pass
def test_state_dict_round_trip_resumes_bit_exactly(skip: int) -> None:
    cfg = replace(CFG, bi_data=True)
    # two forward streams of 120 tokens: 6 batches per pass; skip=9 resumes mid second pass and crosses into the third
    small = TokenStream(ids=STREAM.ids[:240], sentence_ids=STREAM.sentence_ids[:240])
    data = _batches(cfg, small)
    assert len(data) == 6
    for _ in range(skip):
        next(data)
    state = json.loads(json.dumps(data.state_dict()))  # must survive plain serialisation
    expected = [next(data) for _ in range(4)]

    resumed = _batches(cfg, small)
    resumed.load_state_dict(state)
    for want in expected:
        assert _equal(next(resumed), want)


def test_load_state_dict_rejects_another_layout() -> None:
    state = _batches().state_dict()
    with pytest.raises(ValueError, match="different stream layout"):
        _batches(replace(CFG, batch_size=2)).load_state_dict(state)
    with pytest.raises(ValueError, match="different stream layout"):
        _batches(rank=1, world_size=2).load_state_dict(state)


def test_sharding_gives_each_rank_its_own_streams() -> None:
    ranks = [_batches(rank=k, world_size=2) for k in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    n_fwd = 8
    step = len(STREAM) // n_fwd
    slices = STREAM.ids[: n_fwd * step].reshape(n_fwd, step)
    for k, data in enumerate(ranks):
        np.testing.assert_array_equal(data.rows.ids, slices[4 * k : 4 * (k + 1)])
        np.testing.assert_array_equal(next(data)["input_ids"][:, :16], slices[4 * k : 4 * (k + 1), :16])
    # the rank's random stream depends on the rank, not only on the seed
    assert ranks[0].state_dict()["rng"] != ranks[1].state_dict()["rng"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 32, "reuse_len": 32}, "reuse_len .* must be smaller than seq_len"),
        ({"seq_len": 32, "reuse_len": 28}, "no room for both segments"),
        ({"seq_len": 32, "reuse_len": 16, "num_predict": 30}, "num_predict .* too large"),
        ({"seq_len": 32, "reuse_len": 16, "perm_size": 32}, "perm_size .* must be <= reuse_len"),
        ({"seq_len": 36, "reuse_len": 16, "perm_size": 16}, "must divide both"),
        ({"bi_data": True, "batch_size": 3}, "even batch_size"),
        ({"mask_alpha": 1, "mask_beta": 2}, "mask_alpha .* must be >= mask_beta"),
        ({"num_predict": 0}, "num_predict must be a positive integer"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
    ],
)
def test_config_validation_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PretrainDataConfig(**kwargs)


def test_config_defaults_follow_the_original() -> None:
    cfg = PretrainDataConfig()
    assert (cfg.seq_len, cfg.reuse_len, cfg.num_predict, cfg.perm_size) == (512, 256, 85, 256)
    assert (cfg.mask_alpha, cfg.mask_beta, cfg.max_gram) == (6, 1, 5)


def test_corpus_too_small_for_the_batch() -> None:
    small = TokenStream(ids=STREAM.ids[:200], sentence_ids=STREAM.sentence_ids[:200])
    with pytest.raises(ValueError, match="corpus too small"):
        PretrainBatches(small, WORD_START, replace(CFG, batch_size=8))


def test_token_ids_outside_the_word_start_table() -> None:
    with pytest.raises(ValueError, match="outside word_start_table"):
        PretrainBatches(STREAM, WORD_START[:50], CFG)


# -- the shipped sample with a real sentencepiece model --------------------------------------------------


@pytest.fixture(scope="module")
def sample_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from qa_core.tokenizer import XLNetTokenizer
    from train.tokenizer import train_spm

    out = Path(train_spm([SAMPLE_CORPUS], tmp_path_factory.mktemp("spm_data"), 1000))
    return XLNetTokenizer.from_dir(out if out.is_dir() else out.parent)


def test_sample_corpus_integration(sample_tokenizer) -> None:
    tok = sample_tokenizer
    cfg = PretrainDataConfig(seq_len=128, reuse_len=64, batch_size=4, bi_data=True, perm_size=32, seed=0)
    data = PretrainBatches.from_files([SAMPLE_CORPUS], tok, cfg)
    assert len(data) > 10
    assert (data.rows.ids == EOD_ID).any()  # documents are separated by <eod>
    assert data.rows.ids.max() < tok.vocab_size
    table = tok.word_start_table
    for _ in range(3):
        batch = next(data)
        assert (batch["target_weights"] == 1).all()  # exactly num_predict = 21 targets in every row
        assert batch["target_ids"].shape == (4, 21)
        for r in range(4):
            ids = batch["input_ids"][r]
            pos = batch["target_mapping"][r].argmax(axis=1)
            np.testing.assert_array_equal(batch["target_ids"][r], ids[pos])
            assert not np.isin(ids[pos], [SEP_ID, CLS_ID]).any()
        # forward rows: most masked runs begin on a word start (the rest come from single-token fill-up)
        starts = [
            table[ids[p]]
            for ids, q in zip(batch["input_ids"][:2], batch["input_q"][:2], strict=True)
            for p in np.flatnonzero(np.diff(np.concatenate([[0.0], q])) > 0)
        ]
        assert np.mean(starts) > 0.7
    text = tok.decode(batch["input_ids"][0][:64].tolist())
    assert len(text.split()) > 10  # decodes to real words
