"""train.tokenizer.train_spm: deterministic XLNet sentencepiece models, punctuation and digit pieces,
options, small and bad corpora.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from paths import SAMPLE_CORPUS

from qa_core import contract
from qa_core.tokenizer import SPECIAL_PIECES, XLNetTokenizer
from train.tokenizer import PUNCT_SYMBOLS, train_spm


def test_train_spm_deterministic_and_ids(tmp_path: Path) -> None:
    inputs = [SAMPLE_CORPUS]
    a = train_spm(inputs, tmp_path / "a", 1000, seed=3)
    b = train_spm(inputs, tmp_path / "b", 1000, seed=3)
    assert a.read_bytes() == b.read_bytes()
    tok = XLNetTokenizer.from_dir(a.parent)
    assert tok.vocab_size == 1000
    assert [tok.id_to_piece(i) for i in range(9)] == list(SPECIAL_PIECES)


def _piece_types(model: Path) -> dict[str, int]:
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    return {p.piece: p.type for p in proto.pieces}


def test_train_spm_punct_and_digits(spm_dir: Path, xlnet_tok: XLNetTokenizer) -> None:
    """The README's punctuation user symbols are pieces of their own and digits never merge (defaults), yet
    they are ordinary pieces: HF would split user-defined symbols off as added tokens and lose parity."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    types = _piece_types(spm_dir / "spiece.model")
    assert [p for p, t in types.items() if t == model_pb2.ModelProto.SentencePiece.USER_DEFINED] == ["<eop>"]
    for sym in PUNCT_SYMBOLS:
        assert types.get(sym) == model_pb2.ModelProto.SentencePiece.NORMAL, sym
    pieces = [xlnet_tok.id_to_piece(i) for i in range(len(SPECIAL_PIECES), xlnet_tok.vocab_size)]
    assert "\ue000" not in "".join(pieces)  # the training-only delimiter
    glued = [p for p in pieces if len(p) > 1 and any(c in PUNCT_SYMBOLS or c.isdigit() for c in p)]
    assert not glued
    toks = xlnet_tok.tokenize('In 1971, "Hello" (2,000.5 \u20ac) -- x.')
    assert toks[1:8] == ["\u2581", "1", "9", "7", "1", ",", "\u2581"]  # no "1971," as in the README's models
    assert all(
        len(t.lstrip("\u2581")) == 1 for t in toks if any(c in PUNCT_SYMBOLS or c.isdigit() for c in t)
    )
    assert toks[-2:] == ["x", "."] or toks[-2:] == ["\u2581x", "."]


def test_train_spm_options(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text(
        "\n".join(f"In {1900 + i % 7}, the value (about {i % 5}0%) rose. See also (x)." for i in range(300))
    )
    default = XLNetTokenizer(train_spm([corpus], tmp_path / "d", 200))
    pieces = [default.id_to_piece(i) for i in range(default.vocab_size)]
    assert not [p for p in pieces if len(p) > 1 and any(c in PUNCT_SYMBOLS or c.isdigit() for c in p)]
    assert all(sym in pieces for sym in PUNCT_SYMBOLS)  # required, as user symbols would be, even if unseen
    free = XLNetTokenizer(train_spm([corpus], tmp_path / "f", 200, split_digits=False, punct_symbols=""))
    pieces = [free.id_to_piece(i) for i in range(free.vocab_size)]
    assert [p for p in pieces if sum(c.isdigit() for c in p) > 1]  # multi-digit pieces, as the original
    assert [p for p in pieces if len(p) > 1 and any(c in ".()" for c in p)]  # punctuation glued
    assert "\u20ac" not in pieces
    for bad in (["ab"], [" "], ["\ue000"]):
        with pytest.raises(ValueError, match="punct_symbols"):
            train_spm([corpus], tmp_path / "bad", 200, punct_symbols=bad)
    # max_sentence_length counts the text, not the training-only delimiters around its punctuation
    long = tmp_path / "long.txt"
    long.write_text(f"{'x' * 20}\n{'.' * 90}\u0436\n{'y' * 100}\u0444\n")
    tok = XLNetTokenizer(
        train_spm([long], tmp_path / "l", 100, character_coverage=1.0, max_sentence_length=100)
    )
    assert tok.piece_to_id("\u0436") != contract.UNK_ID and tok.piece_to_id("\u0444") == contract.UNK_ID


def test_train_spm_plain_text_and_small_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("Hello world, this is a tiny corpus.\nIt has two lines.\n\nAnd two documents.\n")
    # soft limit (default): a corpus too small for the asked size gives a smaller vocabulary
    tok = XLNetTokenizer(train_spm([corpus], tmp_path / "soft", 500))
    assert len(SPECIAL_PIECES) < tok.vocab_size < 500
    assert tok.decode(tok.encode("Hello world")) == "Hello world"
    with pytest.raises(ValueError, match=r"too large for this corpus: use --vocab-size \d+ or less"):
        train_spm([corpus], tmp_path / "hard", 500, hard_vocab_limit=True)
    with pytest.raises(ValueError, match="too small"):
        train_spm([SAMPLE_CORPUS], tmp_path / "small", 20)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(ValueError, match="no text"):
        train_spm([empty], tmp_path / "e", 100)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        train_spm([corpus, tmp_path / "missing.txt"], tmp_path / "m", 100)
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"title": "x"}]}')
    with pytest.raises(ValueError, match="bad.json"):
        train_spm([corpus, bad], tmp_path / "b", 100)
    assert not (tmp_path / "b").exists()
