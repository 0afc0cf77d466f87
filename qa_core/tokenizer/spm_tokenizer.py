"""The :class:`XLNetTokenizer`: a sentencepiece model plus the XLNet text conventions (torch-free).

The ONNX/TensorRT server imports it, so it depends on numpy, sentencepiece and the standard library
only. It reproduces the special-symbol layout of zihangdai/xlnet (``data_utils.py``) and is tested
id-for-id against HuggingFace's ``XLNetTokenizer`` loaded from the same ``spiece.model``.

What it adds over plain sentencepiece is :meth:`XLNetTokenizer.encode_with_offsets`: exact character
spans in the *original* text for every token, which SQuAD answer alignment and serving depend on.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np
import sentencepiece as spm

from qa_core.contract import CLS_ID, SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEP_ID, UNK_ID

from .normalize import _clean, _preprocess_aligned, preprocess_text

# Special ids and segment ids: qa_core.contract. The pieces, in id order:
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

SPIECE_UNDERLINE = "\u2581"  # '▁', sentencepiece's word-start marker
MODEL_FILE = "spiece.model"
CONFIG_FILE = "tokenizer_config.json"

# Pieces that start a new word for whole-word span masking, besides '▁...' and '<...>' pieces
# (the original data_utils.py ``_is_start_piece``).
_START_PUNCT = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~')


def _trimmable(c: str) -> bool:
    """Characters a token span should not start or end with: whitespace and invisible format/control chars."""
    return c.isspace() or unicodedata.category(c) in ("Cc", "Cf")


def _is_digit_comma_piece(piece: str) -> bool:
    """A piece of two or more characters that ends in a digit then ``,`` (``▁1997,``, ``7,``)."""
    return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


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

    def fingerprint(self) -> str:
        """sha256 of the model and every flag that changes ids: prepared token ids are only valid with
        the tokenizer of this fingerprint."""
        flags = [self.do_lower_case, self.remove_space, self.keep_accents, self.split_digit_commas]
        digest = hashlib.sha256(self._model_bytes)
        digest.update(json.dumps(flags).encode())
        return digest.hexdigest()

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
