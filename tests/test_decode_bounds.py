"""Decoding is bounded by the window, not by the text: a span widened to whole words never passes
max_answer_len tokens (a 12,000-letter word stays a short span, decoded in bounded time), and the spans
that decide are found exactly, so a server keeping 10, 20 or 100 of them answers every question alike.
The shipped model, in process, through the server's own host path (its featurizing, engine and decode)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from paths import REPO

from qa_core.squad import pad_batch
from qa_core.squad.alignment import word_extent
from qa_core.squad.answerability_features import ContextIndex, match_question, span_features
from qa_core.squad.decode import DecodeOptions
from qa_core.squad.head_outputs import decode_head_outputs
from qa_core.squad.rerank import CANDIDATE_FEATURES, SpanReranker, candidate_features
from qa_core.text import WORD, stem
from qa_core.tokenizer import XLNetTokenizer
from server.answering.host_path import HostPath, Question
from server.answering.model_spec import resolve_spec
from server.backends import create_backend
from server.door.key_check import ANONYMOUS
from server.flags import load_settings

SHIPPED = REPO / "models" / "squad2-small-int8"
SAMPLE_DEV = REPO / "data" / "sample" / "dev.json"
TOP_K = 10  # spans a request lists: the most the re-ranker reads, where merged spans show


def test_a_span_takes_whole_words_only_within_its_token_budget() -> None:
    """The shipped tokenizer's pieces: "Ndjamena" is 5 of them, "1973" 4 (and an empty piece before)."""
    tokenizer = XLNetTokenizer.from_dir(SHIPPED)
    context = "The Ndjamena-based writers met in 1973's autumn."
    _, offsets = tokenizer.encode_with_offsets(context)
    table = np.array(offsets)
    last = len(table) - 1
    assert context[slice(*table[3])] == "ja"
    assert word_extent(context, table, 3, 3, 0, last, 30) == (4, 12)  # inside a word: the whole word
    assert word_extent(context, table, 3, 3, 0, last, 5) == (4, 12)  # exactly its 5 pieces
    assert word_extent(context, table, 3, 3, 0, last, 4) == (6, 8)  # one piece short: kept as it was
    assert word_extent(context, table, 3, 3, 2, last, 30) == (6, 8)  # the word starts before the window
    assert word_extent(context, table, 0, 0, 0, last, 30) == (0, 3)  # already whole
    seven = next(i for i, (a, b) in enumerate(offsets) if context[a:b] == "7")
    assert context[slice(*word_extent(context, table, seven, seven, 0, last, 30))] == "1973"
    assert word_extent(context, table, 7, 8, 0, last, 30) == (13, 26)  # "based writer" -> "...writers"


@pytest.fixture(scope="module")
def shipped():
    spec = resolve_spec(SHIPPED, "onnx")
    engine = create_backend(spec, load_settings(["--model", str(SHIPPED), "--threads", "1"]))
    tokenizer = XLNetTokenizer.from_dir(spec.tokenizer_dir)
    yield spec, engine, tokenizer
    engine.close()


def answer(shipped, pools, question: str, context: str, top_k: int = 1):
    """The question through each pool's host path, the engine run once per window."""
    spec, engine, tokenizer = shipped
    hosts = [  # None: the server's default pool
        HostPath.from_settings(
            spec,
            tokenizer,
            load_settings(["--model", str(SHIPPED), *([] if n is None else ["--n-best-pool", str(n)])]),
        )
        for n in pools
    ]
    items = [Question(question, context, top_k=top_k)]
    groups, _, contexts = hosts[0].featurize_checked(items, ANONYMOUS)
    rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
    decoded = [host.decode_answers(items, groups, contexts, [rows]) for host in hosts]
    return [(preds[0], ms[0]) for preds, ms in decoded], groups[0]


def test_a_12000_letter_word_gives_a_short_best_span_in_bounded_time(shipped) -> None:
    random.seed(0)
    word = "".join(random.choice("abcdefghij") for _ in range(12_000))
    spec, _, tokenizer = shipped
    results, features = answer(shipped, [100], "What is the word?", word)
    found, decode_ms = results[0]
    assert len(features) > 30  # the word spans many windows
    limit = spec.serving.max_answer_len
    for entry in found.n_best:
        assert entry.end_token - entry.start_token + 1 <= limit
        assert len(tokenizer.encode(entry.text)) <= limit + 1, (
            entry.text
        )  # + 1: re-tokenizing may split a piece
    assert 0 < len(found.best_span_text) < 600
    assert decode_ms < 2_000  # bounded by the windows, not the word (~10 ms; a loose bound for loaded CI)


def test_pools_of_10_20_and_100_answer_every_sample_question_alike(shipped) -> None:
    """And so does the server's default, which decodes only the spans the decision reads (the model
    records n_best 20; spans past the first 10 change no answer). Asked for its top 10 spans, every
    pool lists the same ten (spans that snap to the same words are listed once: a pool of 10 that lists
    fewer is widened)."""
    spec, _, tokenizer = shipped
    assert (
        spec.serving.n_best == 20 and HostPath(spec, tokenizer).n_best_pool == spec.decision.spans_read == 10
    )
    data = json.loads(SAMPLE_DEV.read_text())
    questions = [
        (qa["question"], p["context"]) for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]
    ]
    assert len(questions) > 200
    for question, context in questions:
        results, _ = answer(shipped, [10, 20, 100, None], question, context, top_k=TOP_K)
        seen = [
            (p.is_impossible, p.text, p.start, p.end, p.best_span_text, round(p.answerable_prob, 9))
            for p, _ in results
        ]
        assert seen[0] == seen[1] == seen[2] == seen[3], (question, seen)
        listed = [[(e.text, e.start, e.end) for e in p.n_best[:TOP_K]] for p, _ in results]
        assert listed[0] == listed[1] == listed[2] == listed[3], question
        # what the server sends as each span's probability (routes._entry): its share of the best 10
        served = [[e.share for e in p.n_best[:TOP_K]] for p, _ in results]
        assert served[0] == served[1] == served[2] == served[3], question
        assert len(listed[0]) == TOP_K, (question, listed[0])


@pytest.mark.parametrize(
    "context",
    [
        "Supercalifragilisticexpialidocious antidisestablishmentarianism floccinaucinihilipilification.",
        "Pneumonoultramicroscopicsilicovolcanoconiosis, hippopotomonstrosesquippedaliophobia and Llanfairpwllgwyngyll.",
        "The quick brown fox.",
    ],
)
def test_a_context_of_few_whole_words_lists_the_same_spans_at_every_pool(shipped, context: str) -> None:
    """Long words are many pieces, and every span inside one snaps to the word: such a context holds
    fewer distinct spans than a request's 20 may ask for, so a pool is widened until MAX_N_BEST (not
    until a doubling adds nothing, which a larger pool can still undo): every pool lists the same."""
    results, _ = answer(shipped, [10, 20, 40, 100], "What is the word?", context, top_k=20)
    listed = [[(e.start, e.end) for e in p.n_best[:20]] for p, _ in results]
    assert listed[0] == listed[1] == listed[2] == listed[3]
    assert all(context[a:b].strip() == context[a:b] != "" for a, b in listed[0])


def test_a_decision_prepared_while_the_engine_runs_is_the_one_decoding_alone_makes(shipped) -> None:
    """The server computes the decision's question-only evidence (the question's match with the
    sentences, the verifier's features) while the engine runs (``HostPath.prepare_decisions``); every
    sample question's prediction is the same, to the last bit, as one decoded without it (another host
    path, its own cache: nothing shared), also when another question of the context was prepared since."""
    spec, engine, tokenizer = shipped
    assert spec.decision.uses_lexical and spec.decision.verifier is not None  # there is work to prepare
    settings = load_settings(["--model", str(SHIPPED)])
    prepared_host = HostPath.from_settings(spec, tokenizer, settings)
    data = json.loads(SAMPLE_DEV.read_text())
    questions = [
        Question(qa["question"], p["context"])
        for a in data["data"]
        for p in a["paragraphs"]
        for qa in p["qas"]
    ]
    for i, q in enumerate(questions):
        alone_host = HostPath.from_settings(spec, tokenizer, settings)
        items = [q]
        groups, _, contexts = prepared_host.featurize_checked(items, ANONYMOUS)
        rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
        ahead = prepared_host.prepare_decisions(items, contexts)
        assert ahead is not None and ahead[0] is not None and ahead[0].verifier_inputs
        if i % 2:  # another question of the context prepared since: the index holds that one's match
            prepared_host.prepare_decisions([Question("Who was it?", q.context)], contexts)
        prepared = prepared_host.decode_answers(items, groups, contexts, [rows], ahead)[0][0]
        kept = contexts[0].index(q.context)._match
        assert kept is not None and kept[1] is ahead[0]  # decoding read the prepared match
        assert len(ahead[0].verifier_inputs) == 1  # and its verifier features: none computed again
        assert len(ahead[0].verifier_logits) == 1  # nor the verifier's logit on them
        alone_groups, _, alone_contexts = alone_host.featurize_checked(items, ANONYMOUS)
        alone = alone_host.decode_answers(items, alone_groups, alone_contexts, [rows])[0][0]
        assert prepared.to_dict() == alone.to_dict(), q.question


def test_what_the_reranker_read_of_its_best_span_is_what_the_rule_computes(shipped) -> None:
    """The answerability rule reads the best span's evidence (SPAN_FEATURES) off the re-ranker's own
    columns rather than computing it again: on every sample question it equals, to the last bit,
    ``span_features`` of the re-ranked best span. And each candidate's nearness to the question's words
    (the column the re-ranker finds by bisection) is its definition counted word by word."""
    spec, engine, tokenizer = shipped
    reranker = spec.decision.reranker
    assert reranker is not None
    host = HostPath(spec, tokenizer)
    data = json.loads(SAMPLE_DEV.read_text())
    read_count = near_count = 0
    for a in data["data"]:
        for p in a["paragraphs"]:
            index = ContextIndex(p["context"])
            for qa in p["qas"]:
                question = qa["question"]
                groups, _, _ = host.featurize_checked([Question(question, p["context"])], ANONYMOUS)
                rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
                reader = decode_head_outputs(  # no rule, so no re-ranking: the reader's own n-best
                    spec.head, p["context"], groups[0], rows, DecodeOptions.spans(20), question=question
                )
                entries, read = reranker.rerank_reading(question, index, reader.n_best)
                m = match_question(question, index)
                if read is not None:
                    assert (read.start, read.end) == (entries[0].start, entries[0].end)
                    computed = span_features(question, index, m, read.start, read.end)
                    assert {k: v.hex() for k, v in read.features.items()} == {
                        k: v.hex() for k, v in computed.items()
                    }, question
                    read_count += 1
                head = entries[: reranker.top_k]
                near = candidate_features(question, index, m, head)[
                    :, CANDIDATE_FEATURES.index("near_question")
                ]
                for e, got in zip(head, near.tolist(), strict=True):
                    assert got == _nearness_by_hand(index, set(m.stems), e.start, e.end), (question, e.text)
                    near_count += 1
    assert read_count > 200 and near_count > 2000


def test_deciding_with_the_reranker_s_reading_is_deciding_without_it(shipped, monkeypatch) -> None:
    """The rule's inputs taken from the re-ranker's reading of the best span (``redecided``) or computed
    from the span, as before the reading existed: every sample question's prediction is the same, every
    float to the last bit (their JSON: shortest round-tripping repr)."""
    spec, engine, tokenizer = shipped
    data = json.loads(SAMPLE_DEV.read_text())
    questions = [
        Question(qa["question"], p["context"], top_k=TOP_K)
        for a in data["data"]
        for p in a["paragraphs"]
        for qa in p["qas"]
    ]
    host = HostPath(spec, tokenizer)
    inputs = []
    for q in questions:
        groups, _, contexts = host.featurize_checked([q], ANONYMOUS)
        rows = [{k: v[0] for k, v in engine.run(pad_batch([f])).items()} for f in groups[0]]
        inputs.append((groups, contexts, rows))

    def decoded() -> list[str]:
        fresh = HostPath(spec, tokenizer)  # its own context cache: nothing kept from the other pass
        out = []
        for q, (groups, _, rows) in zip(questions, inputs, strict=True):
            _, _, contexts = fresh.featurize_checked([q], ANONYMOUS)
            out.append(json.dumps(fresh.decode_answers([q], groups, contexts, [rows])[0][0].to_dict()))
        return out

    with_reading = decoded()
    reading = SpanReranker.rerank_reading
    monkeypatch.setattr(SpanReranker, "rerank_reading", lambda self, *a: (reading(self, *a)[0], None))
    without = decoded()
    assert with_reading == without
    assert sum('"is_impossible": false' in p for p in with_reading) > 20  # answers, not only abstentions


def _nearness_by_hand(index: ContextIndex, q_stems: set[str], start: int, end: int) -> float:
    """1 / (1 + the fewest words between the span and a question word of its sentence), 0 without one."""
    a, b = index.sentences[index.sentence_of(start, end)]
    found = [(w.start(), w.end(), stem(w.group().lower())) for w in WORD.finditer(index.context, a, b)]
    before = [i for i, (_, e, _) in enumerate(found) if e <= start]  # words wholly before the span
    after = [i for i, (s, _, _) in enumerate(found) if s >= end]  # and wholly after it
    gaps = [len(before) - 1 - i for i in before if found[i][2] in q_stems] + [
        i - (len(found) - len(after)) for i in after if found[i][2] in q_stems
    ]
    return 1.0 / (1.0 + min(gaps)) if gaps else 0.0
