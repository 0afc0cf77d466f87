"""The context cache (server/answering/context_cache.py) on its own, with the real tokenizer and sentence index:
its bound counts what an entry really holds (measured with tracemalloc: the count is an upper bound),
and one key's share keeps a tenant's flood of new contexts from evicting more than that of the others'."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from qa_core.squad.alignment import offsets_array
from qa_core.squad.answerability_features import (
    QUESTION_FEATURES,
    match_question,
    question_features,
    verifier_logit,
)
from qa_core.squad.answerability_params import Linear
from qa_core.tokenizer import XLNetTokenizer
from server.answering.context_cache import KEY_SHARE, ContextCache, EncodedContext, context_key

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "squad2-small-int8"
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "dev.json"
_N = len(QUESTION_FEATURES)
VERIFIER = Linear(QUESTION_FEATURES, (0.0,) * _N, (1.0,) * _N, (0.1,) * _N, 0.0)  # what one costs to keep


def prose() -> str:
    data = json.loads(SAMPLE.read_text())
    return " ".join(p["context"] for a in data["data"] for p in a["paragraphs"])[:20000]


CONTEXTS = {
    "prose": prose,
    "one long word": lambda: "abcdefghij" * 2000,
    "short sentences": lambda: "It rained. " * 1800,
    "numbers": lambda: " ".join(str(n) for n in range(4000)),
}


@pytest.fixture(scope="module")
def tok() -> XLNetTokenizer:
    return XLNetTokenizer.from_dir(SHIPPED)


def entry(tok: XLNetTokenizer, context: str, indexed: bool = True) -> EncodedContext:
    ids, offsets = tok.encode_with_offsets(context)
    return EncodedContext.of(np.asarray(ids, dtype=np.int64), offsets_array(offsets), context, indexed)


@pytest.mark.parametrize("kind", CONTEXTS)
def test_an_entrys_count_is_an_upper_bound_of_what_it_holds(tok: XLNetTokenizer, kind: str) -> None:
    """Everything an entry keeps, measured: its arrays, its sentence index with every sentence's word
    positions built and a question's match kept with its verifier features (the most decoding ever
    builds), and the text the index keeps."""
    context = CONTEXTS[kind]()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = entry(tok, "".join(context))  # a copy: the text is the entry's to keep
        index = kept.index(context)
        for sentence in range(len(index.sentences)):
            index.word_positions(sentence)
        question = "Which of them came first, and where?"
        # the question match it keeps, with the verifier's features memoised in it (every one, the
        # word-pair ones included, which build the context's pairs): what deciding a question leaves
        m = match_question(question, index)
        question_features(question, index, m)
        verifier_logit(question, index, m, VERIFIER, set(QUESTION_FEATURES))  # and the verifier's logit
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= kept.nbytes, (held, kept.nbytes)
    assert kept.nbytes <= 4 * held + 64 * 1024, (held, kept.nbytes)  # and not wildly above it


def test_the_cache_holds_at_most_its_bytes_and_one_key_at_most_its_share(tok: XLNetTokenizer) -> None:
    one = entry(tok, prose())
    cache = ContextCache(max_bytes=int(one.nbytes * 8.5), key_share=KEY_SHARE)  # 8 entries, 2 a key
    for k in range(2):
        cache.put("tenant", context_key("tenant", f"t{k}"), entry(tok, f"{k} " + prose()))
    for k in range(40):  # a flood of new contexts from one key
        cache.put("flood", context_key("flood", f"f{k}"), entry(tok, f"{k} " + prose()))
        assert cache.nbytes <= cache.max_bytes and cache.held_by("flood") <= cache.per_caller
    assert all(cache.get(context_key("tenant", f"t{k}")) is not None for k in range(2))  # untouched
    assert (
        cache.get(context_key("flood", "f39")) is not None and cache.get(context_key("flood", "f0")) is None
    )


def test_without_keys_the_one_caller_has_the_whole_cache_and_zero_turns_it_off(tok: XLNetTokenizer) -> None:
    one = entry(tok, prose())
    whole = ContextCache(max_bytes=int(one.nbytes * 4.5))
    for k in range(4):
        whole.put("anonymous", context_key("anonymous", str(k)), entry(tok, f"{k} " + prose()))
    assert len(whole) == 4
    off = ContextCache(0)
    off.put("anonymous", b"k", one)
    assert len(off) == 0 and off.get(b"k") is None
    with pytest.raises(ValueError, match="fraction"):
        ContextCache(100, key_share=0.0)
