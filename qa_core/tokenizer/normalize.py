"""Text normalisation before sentencepiece: the original XLNet ``preprocess_text``, and an aligned replay of it.

Training (:func:`train.tokenizer.train_spm`) and encoding (:class:`qa_core.tokenizer.XLNetTokenizer`) must
normalise text identically, so both take it from here. :func:`_preprocess_aligned` produces the same
string plus, for every output character, the span of the original text it came from: what exact
token offsets (SQuAD answer alignment, serving) are built on. Standard library only.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

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
