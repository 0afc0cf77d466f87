"""train.tokenizer's character offsets (``encode_with_offsets``) and the aligned normaliser behind them:
hand-written hard cases, SQuAD answers, and properties over generated text.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import SHARED_DEV_NAME, shared_squad_file
from tokenizer_oracle import HARD_TEXTS, OFFSET_ONLY_TEXTS, check_spans, check_words_reconstructed

from qa_core.tokenizer import XLNetTokenizer, preprocess_text
from qa_core.tokenizer.normalize import _preprocess_aligned

SHARED_DEV = shared_squad_file(SHARED_DEV_NAME)


@pytest.mark.parametrize("text", HARD_TEXTS)
def test_offsets_hard_cases(text: str, xlnet_tok: XLNetTokenizer, xlnet_tok_lower: XLNetTokenizer) -> None:
    for tok in (xlnet_tok, xlnet_tok_lower):
        ids, _ = tok.encode_with_offsets(text)
        assert ids == tok.encode(text)
        check_words_reconstructed(tok, text)


@pytest.mark.parametrize("text", OFFSET_ONLY_TEXTS)
def test_offsets_odd_cases(text: str, xlnet_tok: XLNetTokenizer, xlnet_tok_lower: XLNetTokenizer) -> None:
    """Odd inputs: one character expanding to several words, marks with no letter, spacing diaeresis."""
    for tok in (xlnet_tok, xlnet_tok_lower):
        ids, spans = tok.encode_with_offsets(text)
        assert ids == tok.encode(text)
        check_spans(text, ids, spans)
        assert all(text[s:e].strip() == text[s:e] for s, e in spans)


def test_offsets_examples(xlnet_tok: XLNetTokenizer, xlnet_tok_lower: XLNetTokenizer) -> None:
    def pieces_text(tok: XLNetTokenizer, text: str) -> list[str]:
        return [text[s:e] for s, e in tok.encode_with_offsets(text)[1] if e > s]

    assert "".join(pieces_text(xlnet_tok, "Café Müller")) == "CaféMüller"
    assert "".join(pieces_text(xlnet_tok_lower, "Café Müller")) == "CaféMüller"
    # the " of LaTeX quotes covers both characters
    text = "``Hi'' said"
    ids, spans = xlnet_tok.encode_with_offsets(text)
    quotes = [sp for i, sp in zip(ids, spans, strict=True) if xlnet_tok.id_to_piece(i).endswith('"')]
    assert [text[s:e][-2:] for s, e in quotes] == ["``", "''"]
    # a ligature expanded by NFKD: its pieces share the source character
    ids, spans = xlnet_tok.encode_with_offsets("ﬁ")
    assert all(text_span == (0, 1) for text_span in spans if text_span[1] > text_span[0])
    # a pure '▁' token gets an empty span at the start of the next token
    text = "x 東京"
    ids, spans = xlnet_tok.encode_with_offsets(text)
    for k, i in enumerate(ids):
        if xlnet_tok.id_to_piece(i) == "▁":
            assert spans[k][0] == spans[k][1] == spans[k + 1][0]
    assert xlnet_tok.encode_with_offsets("") == ([], [])
    assert xlnet_tok.encode_with_offsets(" \t\u3000 ") == ([], [])
    # lone surrogates (valid JSON escapes) must not crash the server
    ids, spans = xlnet_tok.encode_with_offsets("a\ud800b")
    check_spans("a\ud800b", ids, spans)


def test_offsets_squad_answers(xlnet_tok: XLNetTokenizer) -> None:
    """Every answer of the shared dev file is covered by the tokens overlapping it."""
    if SHARED_DEV is None:
        pytest.skip("../shared is absent (a fresh clone)")
    data = json.loads(SHARED_DEV.read_text(encoding="utf-8"))
    total = contained = exact = 0
    for article in data["data"]:
        for para in article["paragraphs"]:
            context = para["context"]
            ids, spans = xlnet_tok.encode_with_offsets(context)
            assert ids == xlnet_tok.encode(context)
            check_spans(context, ids, spans)
            starts, ends = np.array([s for s, _ in spans]), np.array([e for _, e in spans])
            for qa in para["qas"]:
                for ans in qa["answers"]:
                    a = ans["answer_start"]
                    b = a + len(ans["text"])
                    assert context[a:b] == ans["text"]
                    hit = np.flatnonzero((starts < b) & (ends > a))
                    total += 1
                    assert hit.size, (ans, context[a - 20 : b + 20])
                    s, e = starts[hit[0]], ends[hit[-1]]
                    contained += s <= a and e >= b
                    exact += context[s:e].strip() == ans["text"].strip()
    print(
        f"SQuAD dev answers: {total}; token spans contain the answer: {contained} ({contained / total:.2%}); "
        f"map back to exactly the answer text: {exact} ({exact / total:.2%})"
    )
    assert contained == total
    # The rest are answers cut inside a piece ("1971" of "1971,") -- vocabulary, not offsets.
    assert exact / total > 0.95


_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(exclude_categories=("Cs",)),  # anything but lone surrogates
        st.sampled_from(list(" \t\n\u00a0\u3000`'\"éü東😀\u0301ﬁ½Σς")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT)
def test_offsets_property_unicode(
    text: str, xlnet_tok: XLNetTokenizer, xlnet_tok_lower: XLNetTokenizer
) -> None:
    for tok in (xlnet_tok, xlnet_tok_lower):
        norm, starts, ends = _preprocess_aligned(text, tok.do_lower_case, tok.remove_space, tok.keep_accents)
        assert norm == preprocess_text(text, tok.do_lower_case, tok.remove_space, tok.keep_accents)
        assert len(starts) == len(ends) == len(norm)
        ids, spans = tok.encode_with_offsets(text)
        assert ids == tok.encode(text)
        check_spans(text, ids, spans)


@settings(max_examples=100, deadline=None)
@given(text=_TEXT, keep_accents=st.booleans(), remove_space=st.booleans(), lower=st.booleans())
def test_preprocess_aligned_all_flags(text: str, keep_accents: bool, remove_space: bool, lower: bool) -> None:
    norm, starts, ends = _preprocess_aligned(text, lower, remove_space, keep_accents)
    assert norm == preprocess_text(text, lower, remove_space, keep_accents)
    assert all(0 <= s < e <= len(text) for s, e in zip(starts, ends, strict=True))
    assert starts == sorted(starts) and ends == sorted(ends)


_WORD = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
_SEP = st.sampled_from([" ", "  ", "\t", "\n", " \u00a0", "\u3000", "\r\n"])


@settings(max_examples=150, deadline=None)
@given(words=st.lists(_WORD, min_size=1, max_size=8), seps=st.lists(_SEP, min_size=9, max_size=9))
def test_offsets_property_ascii_words(
    words: list[str], seps: list[str], xlnet_tok: XLNetTokenizer, xlnet_tok_lower: XLNetTokenizer
) -> None:
    text = seps[0] + "".join(w + s for w, s in zip(words, seps[1:], strict=False))
    for tok in (xlnet_tok, xlnet_tok_lower):
        check_words_reconstructed(tok, text)


def test_offsets_other_flags(spm_dir: Path) -> None:
    model = spm_dir / "spiece.model"
    for tok in (XLNetTokenizer(model, keep_accents=True), XLNetTokenizer(model, remove_space=False)):
        for text in HARD_TEXTS:
            ids, spans = tok.encode_with_offsets(text)
            assert ids == tok.encode(text)
            check_spans(text, ids, spans)
    tok = XLNetTokenizer(model, keep_accents=True)
    ids, spans = tok.encode_with_offsets("Café au lait")
    assert "".join("Café au lait"[s:e] for s, e in spans) == "Caféaulait"


def test_unicode_tables_agree() -> None:
    """The aligned normaliser relies on per-character NFKD matching whole-string NFKD (marks aside)."""
    text = "Ǆemaiḯ ﬁ ½ Å ῼ"
    per_char = "".join(
        d for c in text for d in unicodedata.normalize("NFKD", c) if not unicodedata.combining(d)
    )
    assert per_char == preprocess_text(text)
