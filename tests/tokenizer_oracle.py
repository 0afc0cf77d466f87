"""Oracles and hard cases for the tokenizer tests: the original XLNet ``encode_ids`` restated
independently of train.tokenizer, HuggingFace's tokenizer (a dev dependency), texts that are hard to
tokenize, and checks of character offsets."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from qa_core import contract
from qa_core.tokenizer import XLNetTokenizer

# Hand-written hard cases for offsets (and HF parity where HF follows the original XLNet rules).
HARD_TEXTS = [
    "Café Müller",
    "``quoted'' text and ``more''",
    "tabs\tbetween\t\twords",
    "double  spaces   here",
    "non\u00a0breaking\u00a0spaces",
    "ideographic\u3000space",
    "  leading and trailing  ",
    "line\nbreaks\r\nhere",
    "東京タワー is in 東京",
    "emoji 😀 and 👨\u200d👩\u200d👧 family",
    "ﬁne ½ ligatures ㈱",
    "e\u0301 combining and Å",
    "İstanbul STRASSE Straße",
    "zero\u200bwidth and soft\u00adhyphen",
    "The U.S. had 853,382 people in 2014, up 1.5%.",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
]
# Offsets only: not words in the usual sense, or (Greek final sigma) lower-cased differently by HF.
OFFSET_ONLY_TEXTS = ["ΣΊΣΥΦΟΣ ΟΔΟΣ", "\ufdfa ligature of four words", "a \u0301b \u00a8c"]


def squad_texts(path: Path, questions: bool = True) -> Iterator[str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    for article in data["data"]:
        for para in article["paragraphs"]:
            yield para["context"]
            if questions:
                yield from (qa["question"] for qa in para["qas"])


def hf_from_dir(directory: Path):
    import transformers  # the test oracle: a dev dependency, never skipped

    return transformers.XLNetTokenizer.from_pretrained(str(directory))


def original_encode_ids(sp, text: str, lower: bool = False) -> list[int]:
    """The original XLNet's ``preprocess_text`` + ``encode_ids`` (prepro_utils.py), restated here as an
    oracle independent of train.tokenizer: piece strings from sentencepiece, ``<digits>,`` pieces
    re-encoded without their comma, then looked up as ids."""
    text = " ".join(text.strip().split()).replace("``", '"').replace("''", '"')
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    text = text.lower() if lower else text
    pieces: list[str] = []
    for piece in sp.encode_as_pieces(text):
        if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
            sub = sp.encode_as_pieces(piece[:-1].replace("\u2581", ""))
            if piece[0] != "\u2581" and sub[0][0] == "\u2581":
                sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:], *sub[1:]]
            pieces += [*sub, ","]
        else:
            pieces.append(piece)
    return [sp.piece_to_id(p) for p in pieces]


def check_spans(text: str, ids: list[int], spans: list[tuple[int, int]]) -> None:
    """Spans are in bounds, starts never decrease, ends of non-empty spans never decrease."""
    assert len(ids) == len(spans)
    prev_start = prev_end = 0
    for start, end in spans:
        assert 0 <= start <= end <= len(text), (text, spans)
        assert start >= prev_start, (text, spans)
        if end > start:
            assert end >= prev_end, (text, spans)
            prev_end = end
        prev_start = start


def check_words_reconstructed(tok: XLNetTokenizer, text: str) -> None:
    """Every whitespace-separated word is covered exactly by the tokens that overlap it, and no token
    straddles two words (what SQuAD answer alignment needs)."""
    ids, spans = tok.encode_with_offsets(text)
    check_spans(text, ids, spans)
    pos = 0
    for word in text.split():
        ws = text.index(word, pos)
        we = pos = ws + len(word)
        inside = [(s, e) for s, e in spans if e > s and s < we and e > ws]
        assert inside, (text, word, spans)
        assert all(ws <= s and e <= we for s, e in inside), (text, word, spans)
        assert min(s for s, _ in inside) == ws and max(e for _, e in inside) == we, (text, word, spans)
    # tokens that cover nothing are '▁' markers, or unknown invisible characters (a lone ZWJ)
    for i, (s, e) in zip(ids, spans, strict=True):
        if s == e:
            assert tok.id_to_piece(i) == "▁" or i == contract.UNK_ID, (text, tok.id_to_piece(i))
