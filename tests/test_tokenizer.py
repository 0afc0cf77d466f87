"""train.tokenizer: XLNet conventions (special ids, preprocessing, inputs, encode and decode), loading and
saving, the command line and import hygiene.

HuggingFace parity, character offsets and training have their own files (test_tokenizer_*.py); the
models are trained here, on the shipped sample.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from paths import REPO, SAMPLE, SAMPLE_CORPUS, SAMPLE_DEV, SAMPLE_TRAIN
from tokenizer_oracle import HARD_TEXTS, OFFSET_ONLY_TEXTS, hf_from_dir, original_encode_ids, squad_texts

from qa_core import contract
from qa_core.tokenizer import SPECIAL_PIECES, XLNetTokenizer, preprocess_text
from train.tokenizer import train_spm
from train.tokenizer.cli import main

# ---- conventions ----------------------------------------------------------------------------------


def test_special_ids_layout(xlnet_tok: XLNetTokenizer) -> None:
    order = ("UNK", "BOS", "EOS", "CLS", "SEP", "PAD", "MASK", "EOD", "EOP")  # the original's piece order
    assert tuple(range(9)) == tuple(getattr(contract, f"{name}_ID") for name in order)
    assert [xlnet_tok.id_to_piece(i) for i in range(9)] == list(SPECIAL_PIECES)
    assert all(xlnet_tok.piece_to_id(p) == i for i, p in enumerate(SPECIAL_PIECES))
    control = [getattr(contract, f"{name}_ID") for name in order[1:-1]]  # <unk> and <eop> are not control
    assert all(xlnet_tok.sp.is_control(i) for i in control)
    # <eop> is a user symbol as in XLNet (the only one: the README's punctuation user symbols are plain
    # pieces here, see test_tokenizer_training.py): "<eop>" in text encodes to it; control ones do not.
    assert contract.EOP_ID in xlnet_tok.encode("end of paragraph <eop> next")
    assert contract.SEP_ID not in xlnet_tok.encode("a <sep> b")
    assert xlnet_tok.vocab_size == len(xlnet_tok) == 2000
    assert xlnet_tok.piece_to_id("no-such-piece-here") == contract.UNK_ID


def test_preprocess_text_matches_original_rules() -> None:
    assert preprocess_text("  a \t b\n\nc  ") == "a b c"
    assert preprocess_text("``hi''") == '"hi"'
    assert preprocess_text("Café Müller") == "Cafe Muller"
    assert preprocess_text("Café", keep_accents=True) == "Café"
    assert preprocess_text("ÉCOLE", lower=True) == "ecole"
    assert preprocess_text("a  b", remove_space=False) == "a  b"
    assert preprocess_text("ﬁ ½") == "fi 1⁄2"  # NFKD is a compatibility decomposition
    assert preprocess_text("ΟΔΟΣ", lower=True) == "οδος"  # str.lower() (final sigma), as the original
    assert preprocess_text("x\u00a0\u3000y") == "x y"


def test_build_inputs(xlnet_tok: XLNetTokenizer) -> None:
    ids, segs = xlnet_tok.build_inputs([10, 11], [20])
    assert ids == [10, 11, contract.SEP_ID, 20, contract.SEP_ID, contract.CLS_ID]
    assert segs == [
        contract.SEG_ID_A,
        contract.SEG_ID_A,
        contract.SEG_ID_A,
        contract.SEG_ID_B,
        contract.SEG_ID_B,
        contract.SEG_ID_CLS,
    ]
    assert xlnet_tok.build_inputs([10, 11]) == ([10, 11, contract.SEP_ID, contract.CLS_ID], [0, 0, 0, 2])
    assert xlnet_tok.build_inputs([], []) == ([contract.SEP_ID, contract.SEP_ID, contract.CLS_ID], [0, 1, 2])


def test_word_start_table(xlnet_tok: XLNetTokenizer) -> None:
    table = xlnet_tok.word_start_table
    assert table.dtype == np.bool_ and table.shape == (xlnet_tok.vocab_size,)
    assert table is xlnet_tok.word_start_table  # cached
    assert all(table[i] == xlnet_tok.is_word_start(i) for i in range(xlnet_tok.vocab_size))
    assert table[: len(SPECIAL_PIECES)].all()
    for i in range(len(SPECIAL_PIECES), xlnet_tok.vocab_size):
        piece = xlnet_tok.id_to_piece(i)
        if piece.startswith("▁") or piece in {",", ".", "(", ")", '"', "-"}:
            assert table[i], piece
        elif piece.isalnum():
            assert not table[i], piece
    ids = xlnet_tok.encode("internationalization")  # several pieces, one word
    assert table[ids].tolist() == [True] + [False] * (len(ids) - 1)


@pytest.mark.parametrize("lower", [False, True], ids=["cased", "uncased"])
def test_encode_follows_the_original_encode_ids(lower: bool, request: pytest.FixtureRequest) -> None:
    """encode and encode_batch against the original algorithm restated in tokenizer_oracle (not our code)."""
    tok = request.getfixturevalue("xlnet_tok_lower" if lower else "xlnet_tok")
    texts = [*HARD_TEXTS, *OFFSET_ONLY_TEXTS, "", "plain", "In 1997, 2,000 people; in 1998,3 more."]
    texts += ["born 1887, died 1955, aged 68", "7, 8, 9", "x1,y2, 3,000,000,"]  # digit + comma re-splits
    texts += list(squad_texts(SAMPLE_DEV))
    expected = [original_encode_ids(tok.sp, t, lower) for t in texts]
    assert [tok.encode(t) for t in texts] == expected
    assert tok.encode_batch(texts) == expected


def test_encode_batch_refuses_a_string(xlnet_tok: XLNetTokenizer) -> None:
    with pytest.raises(TypeError):
        xlnet_tok.encode_batch("not a list")


def test_decode(xlnet_tok: XLNetTokenizer) -> None:
    text = "Jacksonville is the largest city in Florida."
    ids = xlnet_tok.encode(text)
    assert xlnet_tok.decode(ids) == text
    assert xlnet_tok.decode(np.asarray(ids)) == text
    full, _ = xlnet_tok.build_inputs(ids, xlnet_tok.encode("Where is it"))
    assert xlnet_tok.decode(full) == text + " Where is it"  # specials dropped, the rest decoded as one
    assert xlnet_tok.decode(full, skip_special=False) == text + "<sep>Where is it<sep><cls>"
    assert "\u2047" in xlnet_tok.decode(xlnet_tok.encode("東京 x"))  # <unk> stays visible (sp's ' ⁇ ')
    assert xlnet_tok.decode([]) == ""
    with pytest.raises(IndexError):
        xlnet_tok.decode([xlnet_tok.vocab_size])


# ---- loading, saving ----------------------------------------------------------------------------------


def test_save_and_from_dir_roundtrip(xlnet_tok_lower: XLNetTokenizer, tmp_path: Path) -> None:
    out = xlnet_tok_lower.save(tmp_path / "tok")
    assert sorted(p.name for p in out.iterdir()) == ["spiece.model", "tokenizer_config.json"]
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["do_lower_case"] is True and cfg["keep_accents"] is False and cfg["remove_space"] is True
    again = XLNetTokenizer.from_dir(out)
    assert (again.do_lower_case, again.keep_accents, again.remove_space) == (True, False, True)
    assert again.vocab_size == xlnet_tok_lower.vocab_size
    assert again.encode("Hello WORLD") == xlnet_tok_lower.encode("Hello WORLD")
    assert again.model_file == out / "spiece.model"


def test_from_dir_huggingface_layout(spm_dir_lower: Path, tmp_path: Path) -> None:
    """A HF checkpoint dir: spiece.model plus HF's own tokenizer_config.json (many more keys)."""
    hf = hf_from_dir(spm_dir_lower)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["do_lower_case"] is True
    if not (tmp_path / "spiece.model").exists():  # HF v5 saves only tokenizer.json: copy the spm in
        with pytest.raises(FileNotFoundError, match="tokenizer.json-only"):
            XLNetTokenizer.from_dir(tmp_path)
        (tmp_path / "spiece.model").write_bytes((spm_dir_lower / "spiece.model").read_bytes())
    tok = XLNetTokenizer.from_dir(tmp_path)
    assert tok.do_lower_case is True
    assert tok.encode("Hello WORLD") == hf("Hello WORLD", add_special_tokens=False)["input_ids"]


def test_from_dir_errors(tmp_path: Path, spm_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no spiece.model"):
        XLNetTokenizer.from_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        XLNetTokenizer(tmp_path / "missing.model")
    (tmp_path / "spiece.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        XLNetTokenizer.from_dir(tmp_path)
    (tmp_path / "spiece.model").write_bytes((spm_dir / "spiece.model").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(ValueError, match="do_lower_case"):
        XLNetTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="invalid JSON"):
        XLNetTokenizer.from_dir(tmp_path)


def test_rejects_model_without_xlnet_symbols(tmp_path: Path) -> None:
    import sentencepiece as spm

    text = tmp_path / "t.txt"
    text.write_text("\n".join(["the quick brown fox jumps over the lazy dog"] * 50))
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "plain"), vocab_size=30, minloglevel=2
    )
    with pytest.raises(ValueError, match="XLNet special symbols"):
        XLNetTokenizer(tmp_path / "plain.model")


# ---- CLI and import hygiene ----------------------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_trains_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tok"
    assert main(["--input", str(SAMPLE_CORPUS), "--vocab-size", "1500", "--out", str(out), "--lower"]) == 0
    printed = capsys.readouterr().out
    assert "vocab size: 1500" in printed and "pieces:" in printed and "<eop>=8" in printed
    tok = XLNetTokenizer.from_dir(out)
    assert tok.do_lower_case and tok.vocab_size == 1500
    assert not any(sum(c.isdigit() for c in tok.id_to_piece(i)) > 1 for i in range(tok.vocab_size))
    args = [
        "--input",
        str(SAMPLE_CORPUS),
        "--vocab-size",
        "1500",
        "--out",
        str(out),
        "--no-split-digits",
    ]
    assert main(args) == 0
    assert "split_digits=False" in capsys.readouterr().out
    tok = XLNetTokenizer.from_dir(out)
    assert any(sum(c.isdigit() for c in tok.id_to_piece(i)) > 1 for i in range(tok.vocab_size))


def test_cli_help_and_errors(tmp_path: Path) -> None:
    res = _run("-m", "train.tokenizer", "--help")
    assert res.returncode == 0
    for flag in (
        "--input",
        "--vocab-size",
        "--out",
        "--lower",
        "--keep-accents",
        "--seed",
        "--hard-vocab-limit",
        "--no-split-digits",
    ):
        assert flag in res.stdout
    for args in (
        ["--input", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o")],
        ["--out", str(tmp_path / "o")],
        [
            "--input",
            str(SAMPLE / "README.md"),
            "--vocab-size",
            "5000",
            "--hard-vocab-limit",
            "--out",
            str(tmp_path),
        ],
        ["--input", str(SAMPLE_CORPUS), "--vocab-size", "x", "--out", str(tmp_path)],
    ):
        res = _run("-m", "train.tokenizer", *args)
        assert res.returncode == 2, res.stderr
        # bad input: one line; a bad command line (train.common.cli.Parser): the usage, then one error line
        lines = res.stderr.strip().splitlines()
        if lines[0].startswith("usage:"):
            lines = [line for line in lines if not line.startswith(" ")][1:]
        assert len(lines) == 1 and lines[0].startswith("python -m train.tokenizer: error: "), res.stderr
        assert "Traceback" not in res.stderr


def test_import_is_torch_free() -> None:
    res = _run("-c", "import sys, train.tokenizer, train.common.corpus; print('torch' in sys.modules)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_digit_comma_pieces_are_split_as_the_original(tmp_path: Path) -> None:
    """prepro_utils.encode_pieces: a piece ending in '<digit>,' becomes the pieces of its text without
    the comma, then ','; a piece without the word marker yields pieces without it."""
    model = train_spm([SAMPLE_CORPUS, SAMPLE_TRAIN], tmp_path / "t", 2000, split_digits=False)
    tok = XLNetTokenizer(model)
    raw = XLNetTokenizer(model)
    raw.split_digit_commas = False  # HuggingFace v5's ids
    text = "Born 1887, died 1921, in Paris"
    glued = raw.tokenize(text)
    assert [p for p in glued if len(p) > 1 and p.endswith(",") and p[-2].isdigit()]  # the case is exercised
    pieces = tok.tokenize(text)
    assert not [p for p in pieces if len(p) > 1 and p.endswith(",") and p[-2].isdigit()]
    assert "".join(pieces) == "".join(glued)  # the same text, cut differently
    assert pieces.count(",") == 2 and tok.piece_to_id(",") != contract.UNK_ID
    for p in pieces:  # a split piece keeps the marker only where the glued piece had it
        assert p.replace("\u2581", "") in text
    ids = tok.encode(text)
    assert ids == [tok.piece_to_id(p) for p in pieces] == tok.encode_batch([text])[0]
    assert raw.encode(text) == [raw.piece_to_id(p) for p in glued] != ids
    got_ids, spans = tok.encode_with_offsets(text)
    assert got_ids == ids
    surfaces = [text[b:e] for b, e in spans]
    assert surfaces == [p.replace("\u2581", "") for p in pieces]
    assert "split_digit_commas" in json.loads(
        (tok.save(tmp_path / "saved") / "tokenizer_config.json").read_text()
    )
    assert XLNetTokenizer.from_dir(raw.save(tmp_path / "raw")).split_digit_commas is False
