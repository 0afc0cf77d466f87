"""SentencePiece tokenizer with the conventions of the original XLNet code (torch-free).

The ONNX/TensorRT server imports this module, so it depends on numpy, sentencepiece and the standard
library only. It reproduces ``preprocess_text`` and the special-symbol layout of zihangdai/xlnet
(``prepro_utils.py``, ``data_utils.py``) and is tested id-for-id against HuggingFace's
``XLNetTokenizer`` loaded from the same ``spiece.model``.

What it adds over plain sentencepiece is :meth:`XLNetTokenizer.encode_with_offsets`: exact character
spans in the *original* text for every token, which SQuAD answer alignment and serving depend on.

CLI: ``python -m train.tokenizer --input FILE [FILE ...] --vocab-size N --out DIR [--lower] [--no-split-digits]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
import time
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from train.contract import (
    BOS_ID,
    CLS_ID,
    EOD_ID,
    EOP_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    SEG_ID_A,
    SEG_ID_B,
    SEG_ID_CLS,
    SEG_ID_PAD,
    SEP_ID,
    UNK_ID,
)

__all__ = [
    "BOS_ID",
    "CLS_ID",
    "CONFIG_FILE",
    "CONTROL_SYMBOLS",
    "EOD_ID",
    "EOP_ID",
    "EOS_ID",
    "MASK_ID",
    "MODEL_FILE",
    "PAD_ID",
    "PUNCT_SYMBOLS",
    "SEG_ID_A",
    "SEG_ID_B",
    "SEG_ID_CLS",
    "SEG_ID_PAD",
    "SEP_ID",
    "SPECIAL_PIECES",
    "SPIECE_UNDERLINE",
    "UNK_ID",
    "USER_SYMBOLS",
    "XLNetTokenizer",
    "main",
    "preprocess_text",
    "train_spm",
]

# Special ids and segment ids: train.contract. The pieces, in id order:
SPECIAL_PIECES: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    "<cls>",
    "<sep>",
    "<pad>",
    "<mask>",
    "<eod>",
    "<eop>",
)
CONTROL_SYMBOLS: tuple[str, ...] = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")  # ids 3..7
USER_SYMBOLS: tuple[str, ...] = ("<eop>",)  # id 8; a user symbol, so "<eop>" in text encodes to it
# The rest of the original ``--user_defined_symbols=<eop>,.,(,),",-,–,£,€``. We keep these characters
# whole pieces of their own, but as a training-time constraint on ordinary pieces, not as user-defined
# symbols: see train_spm for why (HuggingFace parity).
PUNCT_SYMBOLS: tuple[str, ...] = (".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")


SPIECE_UNDERLINE = "\u2581"  # '▁', sentencepiece's word-start marker
MODEL_FILE = "spiece.model"
CONFIG_FILE = "tokenizer_config.json"
DEFAULT_NUM_THREADS = 4  # fixed (not cpu_count) so training gives the same model on every machine

# Pieces that start a new word for whole-word span masking, besides '▁...' and '<...>' pieces
# (the original data_utils.py ``_is_start_piece``).
_START_PUNCT = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~')
# Training-only word boundary (sentencepiece's ``pretokenization_delimiter``), put around PUNCT_SYMBOLS.
# A private-use character: nmt_nfkc keeps it, and it does not occur in ordinary text.
_TRAIN_DELIMITER = "\ue000"
_MAX_SENTENCE_LENGTH_LIMIT = 1 << 30  # sentencepiece's upper bound for max_sentence_length
_SURROGATES = re.compile("[\ud800-\udfff]")


def preprocess_text(
    text: str, lower: bool = False, remove_space: bool = True, keep_accents: bool = False
) -> str:
    """Normalise text before sentencepiece, exactly as the original XLNet ``prepro_utils.preprocess_text``.

    Collapses whitespace runs to one space (and strips), maps LaTeX-style quotes ``\\`\\``` and
    ``''`` to ``"``, drops accents (NFKD, then removes combining marks) unless ``keep_accents``,
    and lower-cases if asked. Training and encoding must share this so the vocabulary sees what the
    encoder will feed it.
    """
    out = " ".join(text.strip().split()) if remove_space else text
    out = out.replace("``", '"').replace("''", '"')
    if not keep_accents:
        out = unicodedata.normalize("NFKD", out)
        out = "".join(c for c in out if not unicodedata.combining(c))
    if lower:
        out = out.lower()
    return out


def _clean(text: str) -> str:
    """Replace lone surrogates (valid in a Python str and in JSON, not in UTF-8) so encoding never crashes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _SURROGATES.sub("\ufffd", text)
    return text


_Edit = tuple[int, int, str]  # replace normalised[i:j] by a string


def _apply_edits(
    norm: str, starts: list[int], ends: list[int], edits: list[_Edit], attach_deleted: bool = False
) -> tuple[str, list[int], list[int]]:
    """Apply sorted, non-overlapping edits; every output char of an edit points at the source of what it replaced.

    With ``attach_deleted``, what an edit deletes joins the span of the character before it (unless that
    is whitespace), so a dropped combining mark stays inside its letter's span: "e\u0301" -> "e" over both.
    """
    if not edits:
        return norm, starts, ends
    parts: list[str] = []
    s2: list[int] = []
    e2: list[int] = []
    prev = 0
    last = ""  # the last output character so far
    for i, j, out in edits:
        if i > prev:
            parts.append(norm[prev:i])
            s2 += starts[prev:i]
            e2 += ends[prev:i]
            last = norm[i - 1]
        if out:
            parts.append(out)
            s2 += [starts[i]] * len(out)
            e2 += [ends[j - 1]] * len(out)
            last = out[-1]
        elif attach_deleted and last and not last.isspace():
            e2[-1] = ends[j - 1]
        prev = j
    parts.append(norm[prev:])
    s2 += starts[prev:]
    e2 += ends[prev:]
    return "".join(parts), s2, e2


@lru_cache(maxsize=65536)
def _strip_accents_char(c: str) -> str:
    return "".join(d for d in unicodedata.normalize("NFKD", c) if not unicodedata.combining(d))


_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_SPACE_RUN = re.compile(r"\s+")


def _preprocess_aligned(
    text: str, lower: bool, remove_space: bool, keep_accents: bool
) -> tuple[str, list[int], list[int]]:
    """``preprocess_text`` that also says where every output character came from.

    Returns ``(normalised, starts, ends)``: normalised char ``k`` was produced by ``text[starts[k]:ends[k]]``.
    Each step of ``preprocess_text`` is replayed as a list of edits with source spans; the result is
    the very same string (checked by the tests), so ids from it equal ``encode``'s.
    """
    norm = text
    starts = list(range(len(text)))
    ends = list(range(1, len(text) + 1))
    # 1. whitespace: strip, and collapse every run (as str.split(), which \s matches) to one space.
    if remove_space:
        edits: list[_Edit] = []
        for m in _SPACE_RUN.finditer(norm):
            i, j = m.span()
            if i == 0 or j == len(norm):
                edits.append((i, j, ""))
            elif j - i > 1 or norm[i] != " ":
                edits.append((i, j, " "))
        norm, starts, ends = _apply_edits(norm, starts, ends, edits)
    # 2. `` and '' -> ", like str.replace (left to right, non-overlapping), `` first.
    for pair in ("``", "''"):
        if pair in norm:
            edits = [(m.start(), m.end(), '"') for m in re.finditer(pair, norm)]
            norm, starts, ends = _apply_edits(norm, starts, ends, edits)
    # 3. accents: NFKD per character, combining marks dropped. Per-character decomposition differs from
    #    whole-string NFKD only in the canonical reordering of combining marks, and those are dropped.
    if not keep_accents and not norm.isascii():
        edits = []
        for m in _NON_ASCII.finditer(norm):
            c = m.group()
            out = _strip_accents_char(c)
            if out != c:
                edits.append((m.start(), m.end(), out))
        norm, starts, ends = _apply_edits(norm, starts, ends, edits, attach_deleted=True)
    # 4. lower-case: the characters come from the whole-string lower() (Greek final sigma depends on
    #    context), the alignment from per-character lowering (which alone can change lengths).
    if lower:
        full = norm.lower()
        if len(full) != len(norm):
            edits = [(m.start(), m.end(), m.group().lower()) for m in _NON_ASCII.finditer(norm)]
            edits = [ed for ed in edits if len(ed[2]) != 1]
            _, starts, ends = _apply_edits(norm, starts, ends, edits)
            if len(starts) != len(full):
                raise RuntimeError("unexpected context-dependent case mapping in str.lower()")
        norm = full
    return norm, starts, ends


def _trimmable(c: str) -> bool:
    """Characters a token span should not start or end with: whitespace and invisible format/control chars."""
    return c.isspace() or unicodedata.category(c) in ("Cc", "Cf")


class XLNetTokenizer:
    """An XLNet sentencepiece model plus the XLNet text conventions.

    Ids never include special tokens unless asked (:meth:`build_inputs`). Loading checks that the
    model has the XLNet special-symbol layout (``<unk> <s> </s> <cls> <sep> <pad> <mask> <eod> <eop>``
    at ids 0..8), because every other module hard-codes those ids.

    ``split_digit_commas`` (default on, as the original's ``prepro_utils.encode_pieces``): a piece
    that ends in a digit followed by ``,`` (``▁1997,``) is replaced by the pieces of its text without
    the comma, then ``,`` — the published models never saw such pieces in pretraining. Off gives
    HuggingFace v5's ids, which keep them. Models from :func:`train_spm` (digits split) have none.
    """

    def __init__(
        self,
        model_file: str | Path,
        do_lower_case: bool = False,
        remove_space: bool = True,
        keep_accents: bool = False,
        split_digit_commas: bool = True,
    ) -> None:
        self.model_file = Path(model_file)
        if not self.model_file.is_file():
            raise FileNotFoundError(f"sentencepiece model not found: {self.model_file}")
        self.do_lower_case = bool(do_lower_case)
        self.remove_space = bool(remove_space)
        self.keep_accents = bool(keep_accents)
        self.split_digit_commas = bool(split_digit_commas)
        self._model_bytes = self.model_file.read_bytes()  # so save() works even if the file moves
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self._model_bytes)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError depending on version
            raise ValueError(f"{self.model_file}: not a sentencepiece model ({e})") from None
        self.vocab_size: int = self.sp.get_piece_size()
        for i, piece in enumerate(SPECIAL_PIECES):
            got = self.sp.id_to_piece(i) if i < self.vocab_size else None
            if got != piece:
                raise ValueError(
                    f"{self.model_file}: id {i} is {got!r}, expected {piece!r}; this model was not trained "
                    "with the XLNet special symbols (train one with train.tokenizer.train_spm)"
                )
        self._offsets_api = self._detect_offsets_api()
        self._digit_comma = np.array(
            [_is_digit_comma_piece(self.sp.id_to_piece(i)) for i in range(self.vocab_size)], dtype=bool
        )

    def __repr__(self) -> str:
        return (
            f"XLNetTokenizer({str(self.model_file)!r}, vocab_size={self.vocab_size}, "
            f"do_lower_case={self.do_lower_case}, remove_space={self.remove_space}, "
            f"keep_accents={self.keep_accents}, split_digit_commas={self.split_digit_commas})"
        )

    def __len__(self) -> int:
        return self.vocab_size

    # ---- loading and saving -------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> XLNetTokenizer:
        """Load ``spiece.model`` (+ optional ``tokenizer_config.json``) from ours or a HuggingFace XLNet dir."""
        d = Path(directory)
        model = d / MODEL_FILE
        if not model.is_file():
            hint = (
                " (tokenizer.json-only HuggingFace checkpoints are not supported)"
                if (d / "tokenizer.json").exists()
                else ""
            )
            raise FileNotFoundError(f"no {MODEL_FILE} in {d}: not a tokenizer directory{hint}")
        cfg: dict = {}
        cfg_path = d / CONFIG_FILE
        if cfg_path.is_file():
            try:
                cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{cfg_path}: invalid JSON ({e.msg} at line {e.lineno})") from None
            if not isinstance(cfg, dict):
                raise ValueError(f"{cfg_path}: expected a JSON object")
        flags = {}
        for key, default in (
            ("do_lower_case", False),
            ("remove_space", True),
            ("keep_accents", False),
            ("split_digit_commas", True),
        ):
            value = cfg.get(key, default)
            if not isinstance(value, bool):
                raise ValueError(f"{cfg_path}: {key!r} must be true or false, got {value!r}")
            flags[key] = value
        return cls(model, **flags)

    def save(self, directory: str | Path) -> Path:
        """Write ``spiece.model`` + ``tokenizer_config.json``; HuggingFace's XLNetTokenizer can load the dir too."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        model = d / MODEL_FILE
        if not (model.exists() and model.read_bytes() == self._model_bytes):
            model.write_bytes(self._model_bytes)
        # No "model_type" key: HF v5 forwards it into its sentencepiece extractor and fails to load the dir.
        config = {
            "tokenizer_class": "XLNetTokenizer",
            "do_lower_case": self.do_lower_case,
            "remove_space": self.remove_space,
            "keep_accents": self.keep_accents,
            "split_digit_commas": self.split_digit_commas,
            "vocab_size": self.vocab_size,
        }
        (d / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return d

    # ---- vocabulary ---------------------------------------------------------------------------------

    def id_to_piece(self, token_id: int) -> str:
        """The piece string of an id (raises IndexError outside the vocabulary)."""
        return self.sp.id_to_piece(int(token_id))

    def piece_to_id(self, piece: str) -> int:
        """The id of a piece string (UNK_ID if it is not in the vocabulary)."""
        return self.sp.piece_to_id(piece)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of <unk> and the control/user symbols: what ``decode(skip_special=True)`` drops (except <unk>)."""
        return frozenset(
            i
            for i in range(self.vocab_size)
            if self.sp.is_control(i) or self.sp.is_unknown(i) or i < len(SPECIAL_PIECES)
        )

    @cached_property
    def word_start_table(self) -> np.ndarray:
        """Bool array over the vocabulary: does this piece start a word? (vectorised span masking)."""
        table = np.zeros(self.vocab_size, dtype=bool)
        for i in range(self.vocab_size):
            piece = self.sp.id_to_piece(i)
            table[i] = (
                piece.startswith((SPIECE_UNDERLINE, "<"))
                or piece in _START_PUNCT
                or self.sp.is_control(i)
                or self.sp.is_unknown(i)
            )
        return table

    def is_word_start(self, token_id: int) -> bool:
        """True if the piece begins a word: '▁'-prefixed, a special symbol, or a punctuation piece.

        Whole-word span masking in pretraining only cuts spans at word starts; this is the rule of the
        original ``data_utils._is_start_piece``.
        """
        return bool(self.word_start_table[int(token_id)])

    # ---- encoding -----------------------------------------------------------------------------------

    def preprocess(self, text: str) -> str:
        """``preprocess_text`` with this tokenizer's flags."""
        return preprocess_text(_clean(text), self.do_lower_case, self.remove_space, self.keep_accents)

    def tokenize(self, text: str) -> list[str]:
        """Pieces of ``text`` (unknown characters appear as their surface text, as in sentencepiece and HF)."""
        pieces = self.sp.encode(self.preprocess(text), out_type=str)
        if not self.split_digit_commas:
            return pieces
        out: list[str] = []
        for piece in pieces:
            out.extend(self._split_piece(piece) if _is_digit_comma_piece(piece) else [piece])
        return out

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        return self._resplit(self.sp.encode(self.preprocess(text), out_type=int))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` for many texts in one sentencepiece call (faster for corpora)."""
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a sequence of strings; use encode() for one")
        return [
            self._resplit(ids) for ids in self.sp.encode([self.preprocess(t) for t in texts], out_type=int)
        ]

    def _split_piece(self, piece: str) -> list[str]:
        """``▁1997,`` -> the pieces of ``1997`` then ``,``; a piece without the word marker yields
        pieces without it too (the marker the re-encoding adds is dropped, or the bare ``▁`` piece)."""
        sub = self.sp.encode(piece[:-1].replace(SPIECE_UNDERLINE, ""), out_type=str)
        if sub and not piece.startswith(SPIECE_UNDERLINE) and sub[0].startswith(SPIECE_UNDERLINE):
            sub = sub[1:] if sub[0] == SPIECE_UNDERLINE else [sub[0][1:], *sub[1:]]
        return [*sub, ","]

    def _resplit(self, ids: list[int]) -> list[int]:
        """Ids with `<digit>,` pieces split (see :meth:`_resplit_with_offsets`)."""
        return self._resplit_with_offsets(ids, [(0, 0)] * len(ids))[0]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids (equal to ``encode(text)``) plus each token's ``[start, end)`` character span in ``text``.

        Spans refer to the original, unpreprocessed string (what SQuAD's ``answer_start`` counts) and
        exclude the '▁' marker's whitespace and invisible format characters. Starts never decrease, nor
        do the ends of non-empty spans. A token that is only the '▁' marker gets the empty span at the
        start of the next token. Several tokens share a source character when normalisation expanded
        it ('ﬁ' -> 'f' 'i', '½' -> '1' '⁄' '2'); a combining mark that preprocessing dropped belongs
        to the span of its letter, and `````` / ``''`` to the span of the ``"`` they became.
        """
        text = _clean(text)
        norm, src_starts, src_ends = _preprocess_aligned(
            text, self.do_lower_case, self.remove_space, self.keep_accents
        )
        ids, norm_spans = self._resplit_with_offsets(*self._encode_norm_offsets(norm))
        trim = {c for c in set(norm) if _trimmable(c)}
        spans: list[tuple[int, int]] = [(0, 0)] * len(ids)
        next_start = len(text)
        for k in range(len(ids) - 1, -1, -1):
            b, e = norm_spans[k]
            while b < e and norm[b] in trim:
                b += 1
            while e > b and norm[e - 1] in trim:
                e -= 1
            if b >= e:
                spans[k] = (next_start, next_start)
            else:
                spans[k] = (src_starts[b], src_ends[e - 1])
                next_start = src_starts[b]
        return ids, spans

    def _resplit_with_offsets(
        self, ids: list[int], spans: list[tuple[int, int]]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """`_resplit` that also divides each split piece's span: the comma gets the last character, the
        new pieces consecutive runs of the rest by their surface length (a bare ``▁`` an empty one)."""
        if not self.split_digit_commas or not self._digit_comma[ids].any():
            return ids, spans
        out_ids: list[int] = []
        out_spans: list[tuple[int, int]] = []
        for i, (b, e) in zip(ids, spans, strict=True):
            if not self._digit_comma[i]:
                out_ids.append(i)
                out_spans.append((b, e))
                continue
            comma = max(b, e - 1)
            pieces = self._split_piece(self.sp.id_to_piece(i))
            pos = comma - sum(len(p.replace(SPIECE_UNDERLINE, "")) for p in pieces[:-1])
            pos = max(b, pos)
            for p in pieces[:-1]:
                n = len(p.replace(SPIECE_UNDERLINE, ""))
                out_ids.append(self.sp.piece_to_id(p))
                out_spans.append((pos, min(pos + n, comma)))
                pos = min(pos + n, comma)
            out_ids.append(self.sp.piece_to_id(","))
            out_spans.append((comma, e))
        return out_ids, out_spans

    def _detect_offsets_api(self) -> tuple[str, bool]:
        """Which offsets API this sentencepiece has, and whether its offsets count bytes or characters.

        sentencepiece >= 0.2.1 has ``out_type="offset_mapping"`` (character offsets for str input);
        0.2.0 only ``"immutable_proto"``. A probe with multi-byte characters settles the unit.
        """
        probe = "\u00e9\u00e9\u00e9 \u00e9"
        try:
            res = self.sp.encode(probe, out_type="offset_mapping")
            api, end = "offset_mapping", res["offsets"][-1][1]
        except Exception:  # older versions raise RuntimeError/ValueError for an unknown out_type
            api, end = "immutable_proto", self.sp.encode(probe, out_type="immutable_proto").pieces[-1].end  # type: ignore[arg-type]
        return api, end == len(probe.encode("utf-8")) != len(probe)

    def _encode_norm_offsets(self, norm: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and character offsets into ``norm`` (the already preprocessed text)."""
        api, in_bytes = self._offsets_api
        if api == "offset_mapping":
            res = self.sp.encode(norm, out_type="offset_mapping")
            ids, offsets = list(res["ids"]), [(int(b), int(e)) for b, e in res["offsets"]]
        else:
            proto = self.sp.encode(norm, out_type="immutable_proto")  # type: ignore[arg-type]
            ids, offsets = [p.id for p in proto.pieces], [(p.begin, p.end) for p in proto.pieces]
        if in_bytes and not norm.isascii():
            data_len = len(norm.encode("utf-8"))
            byte_to_char = np.empty(data_len + 1, dtype=np.int64)
            pos = 0
            for ci, c in enumerate(norm):
                n = len(c.encode("utf-8"))
                byte_to_char[pos : pos + n] = ci
                pos += n
            byte_to_char[data_len] = len(norm)
            offsets = [(int(byte_to_char[b]), int(byte_to_char[e])) for b, e in offsets]
        return ids, offsets

    def build_inputs(
        self, ids_a: Sequence[int], ids_b: Sequence[int] | None = None
    ) -> tuple[list[int], list[int]]:
        """XLNet model input: ``A <sep> B <sep> <cls>`` (``<cls>`` last) and the segment ids.

        Segments are 0 for A and its <sep>, 1 for B and its <sep>, 2 for <cls> -- as the original
        ``run_squad.py`` / ``run_classifier.py`` and HF's ``XLNetTokenizer(a, b)``.
        """
        ids = [*ids_a, SEP_ID]
        segs = [SEG_ID_A] * len(ids)
        if ids_b is not None:
            ids += [*ids_b, SEP_ID]
            segs += [SEG_ID_B] * (len(ids_b) + 1)
        ids.append(CLS_ID)
        segs.append(SEG_ID_CLS)
        return ids, segs

    # ---- decoding -----------------------------------------------------------------------------------

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``. Control/user symbols are dropped if ``skip_special``, else written as their piece.

        ``<unk>`` is rendered as sentencepiece does (`` ⁇ ``) either way, so unknown text stays visible.
        For the exact original characters of a span use :meth:`encode_with_offsets` instead.
        """
        special = self.special_ids - {UNK_ID}
        parts: list[str] = []
        run: list[int] = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise IndexError(f"token id {i} outside the vocabulary [0, {self.vocab_size})")
            if i in special:
                if not skip_special:
                    if run:
                        parts.append(self.sp.decode(run))
                        run = []
                    parts.append(self.sp.id_to_piece(i))
            else:
                run.append(i)
        if run:
            parts.append(self.sp.decode(run))
        return "".join(parts)


# ---- training ----------------------------------------------------------------------------------------


def _is_digit_comma_piece(piece: str) -> bool:
    """A piece of two or more characters that ends in a digit then ``,`` (``▁1997,``, ``7,``)."""
    return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


def _sp_error(e: Exception, vocab_size: int) -> ValueError:
    """Turn sentencepiece's terse trainer errors into actionable messages."""
    msg = str(e)
    m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
    if m:
        return ValueError(
            f"vocab_size={vocab_size} is too large for this corpus: use --vocab-size {m.group(2)} or less "
            "(or accept a smaller vocabulary: hard_vocab_limit=False, i.e. no --hard-vocab-limit)"
        )
    m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", msg)
    if m:
        return ValueError(
            f"vocab_size={vocab_size} is too small: the corpus needs {m.group(2)} pieces for its characters and "
            "the special symbols; use a larger --vocab-size or a lower character_coverage"
        )
    if "sentences_.empty()" in msg or "all_chars_count" in msg:
        return ValueError("no text found in the inputs (empty files?)")
    return ValueError(f"sentencepiece training failed: {msg.strip()}")


def train_spm(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    vocab_size: int,
    *,
    model_type: str = "unigram",
    character_coverage: float = 0.99995,
    input_sentence_size: int = 10_000_000,
    seed: int = 0,
    do_lower_case: bool = False,
    remove_space: bool = True,
    keep_accents: bool = False,
    hard_vocab_limit: bool = False,
    num_threads: int = DEFAULT_NUM_THREADS,
    max_sentence_length: int = 1 << 15,
    split_digits: bool = True,
    punct_symbols: Iterable[str] = PUNCT_SYMBOLS,
    verbose: bool = False,
) -> Path:
    """Train a sentencepiece model with the original XLNet flags and write a tokenizer dir; return ``spiece.model``.

    Flags follow the XLNet README (unigram, ``character_coverage=0.99995``, control symbols
    ``<cls>,<sep>,<pad>,<mask>,<eod>``, user symbol ``<eop>``, shuffled input), which yields the id
    layout in :data:`SPECIAL_PIECES`. Lines are preprocessed exactly as encoding will preprocess them.
    ``inputs`` are plain-text or SQuAD JSON files (see :mod:`train.corpus`). Deterministic for a given
    input, ``seed`` and ``num_threads``. With ``hard_vocab_limit=False`` (default) a corpus too small for
    ``vocab_size`` gives a smaller vocabulary instead of an error; check ``XLNetTokenizer.vocab_size``.

    Two deviations from the README, both so that SQuAD answers map back to their exact text (a piece
    that glues a word or number to trailing punctuation -- ``1971,``, ``).``, ``".`` -- cannot be cut
    at the answer's end):

    * ``punct_symbols`` (default :data:`PUNCT_SYMBOLS`, the README's other user symbols
      ``. ( ) " - – £ €``) never join another character in a learnt piece, and are always in the
      vocabulary (``required_chars``). The README makes them user-defined symbols; we instead mark
      them as word boundaries for training only (sentencepiece's ``pretokenization_delimiter``), so the
      model stays an ordinary unigram model. Same segmentation in sentencepiece, but HuggingFace's
      conversion turns user-defined symbols into added tokens that it splits off the raw text before
      its whitespace pre-tokenizer, which then drops the space before them and adds a '▁' after
      (``number (or`` -> ``▁number ( ▁or`` instead of ``▁number ▁ ( or``): ids would no longer match
      HuggingFace's ``XLNetTokenizer`` on ~13% of SQuAD texts. ``()`` or ``""`` disables this.
    * ``split_digits=True`` (default): every digit is its own piece, so no piece joins a digit to
      punctuation or to other digits, so ids equal HuggingFace's whether or not ``<digits>,`` pieces
      are re-split at tokenisation time (the original's ``prepro_utils.encode_pieces``, which
      :class:`XLNetTokenizer` does by default for models that have such pieces).
      ``split_digits=False`` (CLI ``--no-split-digits``) learns multi-digit pieces as the original.

    A ``U+E000`` (private use) character in the training text is taken as a boundary and left out.
    """
    from train.corpus import iter_texts  # local import keeps `import train.tokenizer` light

    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' (XLNet) or 'bpe', got {model_type!r}")
    if vocab_size < len(SPECIAL_PIECES) + 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_PIECES) + 1}, got {vocab_size}")
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage}")
    if 0 < input_sentence_size <= 100:  # sentencepiece's own limit
        raise ValueError(
            f"input_sentence_size must be 0 (every line) or more than 100, got {input_sentence_size}"
        )
    if num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    if max_sentence_length < 1:
        raise ValueError(f"max_sentence_length must be at least 1, got {max_sentence_length}")
    punct = tuple(dict.fromkeys(punct_symbols))  # a str is its characters
    for sym in punct:
        if not isinstance(sym, str) or len(sym) != 1 or sym.isspace() or sym == _TRAIN_DELIMITER:
            raise ValueError(f"punct_symbols must be single non-space characters, got {sym!r}")
    # every punctuation character becomes delimiter + character + delimiter
    isolate = str.maketrans({c: f"{_TRAIN_DELIMITER}{c}{_TRAIN_DELIMITER}" for c in punct})
    expansion = 2 * len(_TRAIN_DELIMITER.encode("utf-8")) + 1 if punct else 1
    paths = [Path(p) for p in ([inputs] if isinstance(inputs, str | Path) else inputs)]
    texts = iter_texts(paths)  # validates that every path exists before training starts

    # Errors raised while sentencepiece pulls lines (a bad JSON file mid-way) must surface as themselves.
    failure: list[BaseException] = []

    def lines() -> Iterator[str]:
        try:
            for line in texts:
                line = preprocess_text(_clean(line), do_lower_case, remove_space, keep_accents)
                # the length limit applies to the text, not to the delimiters added below
                if line and len(line.encode("utf-8")) <= max_sentence_length:
                    yield line.translate(isolate) if punct else line
        except Exception as e:  # re-raised below, once sentencepiece has returned
            failure.append(e)

    out = Path(out_dir)
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    punct_options: dict[str, Any] = (
        {"pretokenization_delimiter": _TRAIN_DELIMITER, "required_chars": "".join(punct)} if punct else {}
    )
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines(),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            control_symbols=list(CONTROL_SYMBOLS),
            user_defined_symbols=list(USER_SYMBOLS),
            shuffle_input_sentence=True,
            input_sentence_size=input_sentence_size,
            hard_vocab_limit=hard_vocab_limit,
            num_threads=num_threads,
            max_sentence_length=min(max_sentence_length * expansion, _MAX_SENTENCE_LENGTH_LIMIT),
            split_digits=split_digits,
            **punct_options,
            byte_fallback=False,
            minloglevel=0 if verbose else 2,
        )
    except RuntimeError as e:
        if failure:
            raise failure[0] from None
        raise _sp_error(e, vocab_size) from None
    if failure:
        raise failure[0]
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / MODEL_FILE
    model_path.write_bytes(model.getvalue())
    XLNetTokenizer(model_path, do_lower_case, remove_space, keep_accents).save(out)  # validates ids too
    return model_path


# ---- CLI -----------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line (exit 2), without the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m train.tokenizer",
        description="Train an XLNet sentencepiece tokenizer (original XLNet flags: unigram, <cls> <sep> <pad> "
        '<mask> <eod> control symbols, <eop> user symbol, . ( ) " - – £ € kept as pieces of their own) and save '
        "spiece.model + tokenizer_config.json.",
    )
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="FILE",
        help="training text: plain-text files (a sentence/paragraph per line, blank line between documents) "
        "or SQuAD JSON files (*.json; paragraph contexts are used)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=32000,
        metavar="N",
        help="number of pieces including the 9 special symbols (default: 32000, as XLNet); a corpus too small "
        "for N gives a smaller vocabulary unless --hard-vocab-limit",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if needed)")
    p.add_argument("--lower", action="store_true", help="lower-case text (an uncased model; default: cased)")
    p.add_argument(
        "--keep-accents", action="store_true", help="keep accents instead of stripping them (NFKD)"
    )
    p.add_argument(
        "--character-coverage",
        type=float,
        default=0.99995,
        metavar="F",
        help="fraction of characters covered by the vocabulary; rarer ones become <unk> (default: 0.99995)",
    )
    p.add_argument(
        "--input-sentence-size",
        type=int,
        default=10_000_000,
        metavar="N",
        help="sample at most N lines for training, 0 for all (default: 10000000)",
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="N", help="random seed for line sampling (default: 0)"
    )
    p.add_argument(
        "--num-threads",
        type=int,
        default=DEFAULT_NUM_THREADS,
        metavar="N",
        help=f"trainer threads; the model depends on it, so keep it fixed to reproduce one (default: {DEFAULT_NUM_THREADS})",
    )
    p.add_argument(
        "--hard-vocab-limit",
        action="store_true",
        help="fail instead of producing a smaller vocabulary when the corpus is too small for --vocab-size",
    )
    p.add_argument(
        "--no-split-digits",
        dest="split_digits",
        action="store_false",
        help="learn multi-digit pieces as the original XLNet (default: every digit is a piece of its own, so "
        "numbers never merge with punctuation and SQuAD answers keep their exact text)",
    )
    p.add_argument("--verbose", action="store_true", help="show sentencepiece's training log")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m train.tokenizer``; returns the exit code (2 on bad input)."""
    args = _build_parser().parse_args(argv)
    t0 = time.perf_counter()
    try:
        model_path = train_spm(
            args.input,
            args.out,
            args.vocab_size,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size,
            seed=args.seed,
            do_lower_case=args.lower,
            keep_accents=args.keep_accents,
            hard_vocab_limit=args.hard_vocab_limit,
            num_threads=args.num_threads,
            split_digits=args.split_digits,
            verbose=args.verbose,
        )
        tok = XLNetTokenizer.from_dir(model_path.parent)
    except (OSError, ValueError) as e:
        print(f"python -m train.tokenizer: error: {e}", file=sys.stderr)
        return 2
    from train.corpus import iter_texts

    example = next(iter_texts(args.input), "")[:200]
    learnt = [
        tok.id_to_piece(i) for i in range(len(SPECIAL_PIECES), min(tok.vocab_size, len(SPECIAL_PIECES) + 20))
    ]
    print(f"trained {model_path} in {time.perf_counter() - t0:.1f}s from {len(args.input)} file(s)")
    if tok.vocab_size < args.vocab_size:
        print(f"vocab size: {tok.vocab_size} (asked for {args.vocab_size}; the corpus supports no more)")
    else:
        print(f"vocab size: {tok.vocab_size}")
    print(f"special: {' '.join(f'{p}={i}' for i, p in enumerate(SPECIAL_PIECES))}")
    print(
        f"flags: do_lower_case={tok.do_lower_case} keep_accents={tok.keep_accents} remove_space={tok.remove_space} "
        f"split_digits={args.split_digits}"
    )
    print(f"first learnt pieces: {' '.join(learnt)}")
    if example:
        print(f"example: {example}")
        print(f"  pieces: {' '.join(tok.tokenize(example))}")
        print(f"  ids: {tok.encode(example)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
