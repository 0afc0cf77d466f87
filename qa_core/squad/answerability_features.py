"""The evidence an answerability model reads about one decoded question.

Three kinds, each a dict of named floats: the QA model's own scores (:func:`model_features`), the
question verifier's lexical evidence from the question and the context alone
(:func:`question_features`), and evidence about the best span (:func:`span_features`).
:func:`all_features` computes the ones a model asks for, building a :class:`ContextIndex` only when a
lexical feature is wanted.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from qa_core.text import (
    ANTONYMS,
    MONTHS,
    STOPWORDS,
    WORD,
    capitalised,
    content_stems,
    has_negation,
    has_number,
    numbers,
    sentence_bounds,
    stem,
    words,
)

from .answerability_params import AnswerabilityError, Linear

# The QA model's own scores (every head has cls_logit; null_margin needs start/end logits at <cls>).
MODEL_FEATURES = ("cls_logit", "null_margin", "span_log_prob", "span_top_prob")
# Evidence about the question and the context alone: no QA model, so it can be fitted on the
# fine-tuning questions themselves. "Best sentence" = the sentence covering most of the question's
# content words (weighted by how rare each word is among the context's sentences).
QUESTION_FEATURES = (
    "best_sentence_coverage",
    "second_sentence_coverage",
    "best_sentence_missing",
    "best_sentence_missing_weight",
    "window_coverage",
    "context_coverage",
    "context_missing",
    "question_negated",
    "negation_mismatch",
    "antonym_in_sentence",
    "names_missing_in_sentence",
    "names_missing_in_context",
    "numbers_missing_in_sentence",
    "question_words",
    # what SQuAD 2.0's unanswerable questions are made of: a plausible question written from a sentence
    # with one thing changed (a number swapped, the words reordered, the key word moved to another sentence)
    "numbers_contradicted",
    "bigram_coverage",
    "key_phrase_elsewhere",
)
# Evidence about the best span (how likely it is to be right, for the expected-gain rule).
SPAN_FEATURES = ("span_in_best_sentence", "answer_type_match", "span_in_question", "span_sentence_coverage")
VERIFIER_LOGIT = "verifier_logit"  # the question verifier's output, an input of the combining model
FEATURES = MODEL_FEATURES + QUESTION_FEATURES + SPAN_FEATURES + (VERIFIER_LOGIT,)
NO_SPAN_LOG_PROB = -30.0  # span_log_prob when no valid span exists (far below any real span)


@dataclass(frozen=True)
class SpanScores:
    """What the decoder knows about one question: its model scores and its best span (None: none)."""

    cls_logit: float  # min over windows of the "unanswerable" logit
    null_log_prob: float | None  # best window's log P(start=end=<cls>); None for heads without it
    best_log_prob: float | None  # best span's log P(start) + log P(end); None when there is no span
    best_probability: float  # the best span's share of the top spans' probability mass (0 with none)
    best_start: int = -1  # characters of the context
    best_end: int = -1
    # span_features of the best span when they were read already (a re-ranker reads them of its
    # candidates); None, or a reading of another span: computed from the span when a rule asks
    best_span_read: SpanReading | None = field(default=None, compare=False)


class SpanReading(NamedTuple):
    """``span_features`` of the span ``[start, end)``, read elsewhere (a re-ranker reads them of each of
    its candidates): the span is kept with them, so a reading never stands in for another span's."""

    start: int
    end: int
    features: Mapping[str, float]


class SentenceWords(NamedTuple):
    """One sentence's words as parallel lists (character starts, ends, stems): bisection finds a span's
    words without building a list per call."""

    starts: list[int]
    ends: list[int]
    stems: list[str]


class ContextIndex:
    """Sentences, stems and word rarity of one context, computed once for all its questions."""

    def __init__(self, context: str) -> None:
        self.context = context
        self.sentences = sentence_bounds(context) or [(0, len(context))]
        self.sentence_starts = [a for a, _ in self.sentences]  # a list: bisect on it beats numpy per call
        tokens = [words(context[a:b]) for a, b in self.sentences]  # one pass of the word pattern each
        self.word_count = sum(
            len(t) for t in tokens
        )  # what its memory grows with (server.answering.context_cache)
        self.sentence_stems = [set(content_stems("", t)) for t in tokens]
        self.sentence_words = [set(t) for t in tokens]
        self.stems: set[str] = set().union(*self.sentence_stems)
        self.words: set[str] = set().union(*self.sentence_words)
        self.numbers = numbers(context)
        df: dict[str, int] = {}
        for s in self.sentence_stems:
            for w in s:
                df[w] = df.get(w, 0) + 1
        # the last question's match (see match_question): one, so what it holds is one float a sentence
        # and the question's own (its stems, and the verifier's ~20 features once decided)
        self._match: tuple[str, QuestionMatch] | None = None
        n = len(self.sentences)
        self.idf = {w: math.log(1.0 + n / c) for w, c in df.items()}
        self.unseen_idf = math.log(1.0 + n)  # a word of no sentence is as rare as can be

    def keep(self, question: str, match: QuestionMatch) -> None:
        """Make ``match`` (``question``'s, from :func:`match_question` on this index) the one kept, so
        that deciding reads it instead of computing it again: the server prepares a question's match
        while the engine runs, and another question of the same context may have been kept since."""
        self._match = (question, match)

    def word_positions(self, sentence: int) -> SentenceWords:
        """Where each word of one sentence starts and ends, and its stem; computed once per sentence."""
        cache = self.__dict__.setdefault("_word_positions", {})
        found = cache.get(sentence)
        if found is None:
            a, b = self.sentences[sentence]
            matches = list(WORD.finditer(self.context, a, b))
            found = cache[sentence] = SentenceWords(
                [w.start() for w in matches],
                [w.end() for w in matches],
                [stem(w.group().lower()) for w in matches],
            )
        return found

    @functools.cached_property
    def postings(self) -> dict[str, list[int]]:
        """Each content stem's sentences, in order: a question's coverage of every sentence is then a
        pass over its own stems, not over every sentence."""
        out: dict[str, list[int]] = {}
        for i, stems in enumerate(self.sentence_stems):
            for s in stems:
                out.setdefault(s, []).append(i)
        return out

    def sentence_numbers(self, sentence: int) -> set[str]:
        """The numbers one sentence names (text.numbers), found once per sentence."""
        cache = self.__dict__.setdefault("_sentence_numbers", {})
        found = cache.get(sentence)
        if found is None:
            a, b = self.sentences[sentence]
            found = cache[sentence] = numbers(self.context[a:b], self.sentence_words[sentence])
        return found

    @functools.cached_property
    def _sentence_pairs(self) -> list[set[tuple[str, str]]]:
        sequences = [content_stems(self.context[a:b]) for a, b in self.sentences]
        return [set(zip(q, q[1:], strict=False)) for q in sequences]

    def sentence_pairs(self, sentence: int) -> set[tuple[str, str]]:
        """One sentence's adjacent content-stem pairs, in the order written; built for every sentence
        when a question first asks (a cached context's questions share them)."""
        return self._sentence_pairs[sentence]

    @functools.cached_property
    def pairs(self) -> set[tuple[str, str]]:
        """Every sentence's adjacent content-stem pairs."""
        return set().union(*self._sentence_pairs)

    def sentence_of(self, start: int, end: int) -> int:
        """Index of the sentence holding most of ``[start, end)`` (the first one if none does). Sentences
        are ordered and disjoint, so only those the span meets and their neighbours can win: found by
        bisection, not a pass over all of them."""
        at = bisect.bisect_right(self.sentence_starts, start) - 1
        if at >= 0 and start < end <= self.sentences[at][1]:  # within one sentence (most spans): it wins,
            return at  # the others being disjoint from it
        lo = max(0, at - 1)
        hi = min(len(self.sentences), bisect.bisect_left(self.sentence_starts, end) + 1)
        best, overlap = 0, -1  # as a pass over all would: the first sentence unless one comes within -1
        for i in range(lo, hi):
            a, b = self.sentences[i]
            o = min(b, end) - max(a, start)
            if o > overlap:
                best, overlap = i, o
        return best


@dataclass(frozen=True)
class QuestionMatch:
    """How the question's content words meet the context: the best-matching sentence and its coverage."""

    stems: list[str]  # the question's content stems, each once, in order
    weights: dict[str, float]  # their rarity (idf over the context's sentences)
    coverage: list[float]  # per sentence: the share of the question's weight it holds
    best: int  # the best-matching sentence
    words: list[str]  # the question's words (text.words), read once for every feature that needs them
    kind: str  # the kind of answer it asks for (answer_kind)
    sequence: list[str]  # its content stems as written (repeats kept): word pairs are read off it
    numbers: set[str]  # the numbers it names (text.numbers)
    # question_features' results by the names asked for: they depend on the question and the context
    # alone, so a server computes them while the engine runs (Answerability.prepare) and decoding reads them
    verifier_inputs: dict[frozenset[str] | None, Mapping[str, float]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # a question verifier's logit on them, with the verifier it came from (it reads nothing else)
    verifier_logits: list[tuple[Linear, float]] = field(default_factory=list, compare=False, repr=False)


def match_question(question: str, index: ContextIndex) -> QuestionMatch:
    """The question against every sentence of the context. The re-ranker and the answerability rule both
    ask for it while deciding one question, so the index keeps the last one (one, not a growing map: a
    cached context's memory stays bounded)."""
    kept = index._match  # read once: another thread may decode another question of this context
    if kept is not None and kept[0] == question:
        return kept[1]
    q_words = words(question)
    sequence = content_stems(question, q_words)
    stems = list(dict.fromkeys(sequence))
    weights = {s: index.idf.get(s, index.unseen_idf) for s in stems}
    total = sum(weights.values()) or 1.0
    held: list[list[float]] = [[] for _ in index.sentences]
    postings = index.postings
    for s in stems:  # each sentence's weights in the question's order, summed by sum() as a pass per
        w = weights[s]  # sentence would (Python 3.12's sum() compensates: the same floats on every version)
        for i in postings.get(s, ()):
            held[i].append(w)
    coverage = [sum(h) / total for h in held]
    best = max(range(len(coverage)), key=coverage.__getitem__)  # the first of equals, as numpy's argmax
    found = QuestionMatch(
        stems,
        weights,
        coverage,
        best,
        q_words,
        answer_kind(question, q_words),
        sequence,
        numbers(question, q_words),
    )
    index._match = (question, found)
    return found


# computed only when a model reads them (their per-context pairs cost a pass over the context)
_PAIR_FEATURES = frozenset({"bigram_coverage", "key_phrase_elsewhere"})


def question_features(
    question: str, index: ContextIndex, m: QuestionMatch | None = None, wanted: Collection[str] | None = None
) -> Mapping[str, float]:
    """The question verifier's evidence (no QA model involved); ``wanted``: the names a model reads
    (None: all), so that a model fitted before a feature existed does not pay for it. Computed once
    per question and context (kept with their match): the mapping returned is shared, so read-only."""
    m = m or match_question(question, index)
    key = None if wanted is None else frozenset(wanted)
    kept = m.verifier_inputs.get(key)
    if kept is None:
        kept = m.verifier_inputs[key] = MappingProxyType(_question_features(question, index, m, wanted))
    return kept


def verifier_logit(
    question: str, index: ContextIndex, m: QuestionMatch, verifier: Linear, wanted: Collection[str]
) -> float:
    """The question ``verifier``'s logit. It reads question features only (``wanted`` holds its inputs),
    so it is computed once per question and context, kept with their match as its inputs are: the
    server computes it while the engine runs."""
    for kept, logit in m.verifier_logits:
        if kept is verifier:
            return logit
    if not set(verifier.features) <= set(QUESTION_FEATURES):
        raise AnswerabilityError("a question verifier reads question features only")
    logit = verifier(question_features(question, index, m, wanted))
    m.verifier_logits.append((verifier, logit))
    return logit


def _question_features(
    question: str, index: ContextIndex, m: QuestionMatch, wanted: Collection[str] | None
) -> dict[str, float]:
    b = m.best
    total = sum(m.weights.values()) or 1.0
    window = index.sentence_stems[max(0, b - 1) : b + 2]  # the best sentence and its neighbours
    missing = [s for s in m.stems if s not in index.sentence_stems[b]]
    a0, a1 = index.sentences[b]
    sentence = index.context[a0:a1]
    sentence_words = index.sentence_words[b]
    q_words = m.words  # once: negation, antonyms and numbers read the same tokens
    names = capitalised(question)
    ranked = sorted(m.coverage, reverse=True)
    negated = has_negation(question, q_words)
    q_numbers, s_numbers = m.numbers, index.sentence_numbers(b)
    return {
        "best_sentence_coverage": ranked[0],
        "second_sentence_coverage": ranked[1] if len(ranked) > 1 else 0.0,
        "best_sentence_missing": float(min(6, len(missing))),
        "best_sentence_missing_weight": sum(m.weights[s] for s in missing),
        "window_coverage": sum(m.weights[s] for s in m.stems if any(s in ss for ss in window)) / total,
        "context_coverage": sum(m.weights[s] for s in m.stems if s in index.stems) / total,
        "context_missing": float(min(6, sum(s not in index.stems for s in m.stems))),
        "question_negated": float(negated),
        "negation_mismatch": float(negated != has_negation(sentence, sentence_words)),
        "antonym_in_sentence": float(
            any(ANTONYMS[w] in sentence_words and w not in sentence_words for w in q_words if w in ANTONYMS)
        ),
        "names_missing_in_sentence": float(min(3, sum(n not in sentence_words for n in names))),
        "names_missing_in_context": float(min(3, sum(n not in index.words for n in names))),
        "numbers_missing_in_sentence": float(min(3, len(q_numbers - s_numbers))),
        "question_words": float(min(20, len(m.stems))),
        "numbers_contradicted": float(
            bool(q_numbers) and bool(s_numbers) and q_numbers.isdisjoint(s_numbers)
        ),
        **(
            _pair_features(m.sequence, index, b)
            if wanted is None or not _PAIR_FEATURES.isdisjoint(wanted)
            else {}
        ),
    }


def _pair_features(question: Sequence[str], index: ContextIndex, best: int) -> dict[str, float]:
    """The question's adjacent content-word pairs (order kept) against the sentences'. ``bigram_coverage``:
    the share the best sentence also has adjacent (a question that reuses its words but not their
    relations scores low; 1.0 for a question of fewer than two content words: nothing to contradict).
    ``key_phrase_elsewhere``: the share found in another sentence but not in the best one (the sentence
    matching most of the question's words is not the one that says what it asks)."""
    pairs = set(zip(question, question[1:], strict=False))
    if not pairs:
        return {"bigram_coverage": 1.0, "key_phrase_elsewhere": 0.0}
    in_best = pairs & index.sentence_pairs(best)
    elsewhere = (pairs - in_best) & index.pairs
    return {"bigram_coverage": len(in_best) / len(pairs), "key_phrase_elsewhere": len(elsewhere) / len(pairs)}


_WH_NUMBER = ("how many", "how much", "what percentage", "how long", "how old", "how far", "how large")
_TIME_WORDS = frozenset(m.lower() for m in MONTHS) | {"century", "centuries", "decade", "year", "years"}


def answer_kind(question: str, q_words: Sequence[str] | None = None) -> str:
    """What the question's wh-phrase asks for: "number" (how many), "time" (when), "name" (who), or ""
    when it does not say (what, which, ...). Once per question; :func:`kind_match` per span.
    ``q_words``: ``words(question)`` when the caller has them."""
    q = " ".join(words(question) if q_words is None else q_words)
    if any(f" {p} " in f" {q} " for p in _WH_NUMBER):
        return "number"
    if " when " in f" {q} " or "what year" in q or "what century" in q:
        return "time"
    if {"who", "whom", "whose"} & set(q.split()):
        return "name"
    return ""


def kind_match(kind: str, span: str, span_words: Sequence[str] | None = None) -> float:
    """1 when the span holds an answer of the ``kind`` (:func:`answer_kind`), 0 when it does not, 0.5
    when the question does not say; ``span_words``: ``words(span)`` when the caller has them."""
    if kind == "number":
        return float(has_number(span, span_words))
    if kind == "time":
        tokens = words(span) if span_words is None else span_words
        return float(has_number(span, tokens) or not _TIME_WORDS.isdisjoint(tokens))
    if kind == "name":
        return float(any(w[:1].isupper() and w.lower() not in STOPWORDS for w in WORD.findall(span)))
    return 0.5


def span_features(
    question: str, index: ContextIndex, m: QuestionMatch, start: int, end: int
) -> dict[str, float]:
    """Evidence about the best span ``[start, end)`` (``start < 0``: there is none). A re-ranker reads
    the same of each of its candidates (``rerank.candidate_features``), so decoding with one takes its
    reading (``SpanScores.best_span_read``) rather than calling this."""
    if start < 0:
        return dict.fromkeys(SPAN_FEATURES, 0.0)
    span = index.context[start:end]
    span_words = words(span)
    span_stems = [stem(w) for w in span_words if w not in STOPWORDS]
    q_stems = set(m.stems)  # the question's content stems, as match_question found them
    sentence = index.sentence_of(start, end)
    return {
        "span_in_best_sentence": float(sentence == m.best),
        "answer_type_match": kind_match(m.kind, span, span_words),
        "span_in_question": sum(s in q_stems for s in span_stems) / len(span_stems) if span_stems else 0.0,
        "span_sentence_coverage": m.coverage[sentence],
    }


def model_features(scores: SpanScores) -> dict[str, float]:
    """The model's own evidence. Without a span the span scores sit at a floor far below any span's."""
    best = NO_SPAN_LOG_PROB if scores.best_log_prob is None else max(scores.best_log_prob, NO_SPAN_LOG_PROB)
    null = 0.0 if scores.null_log_prob is None else max(scores.null_log_prob, NO_SPAN_LOG_PROB) - best
    return {
        "cls_logit": float(scores.cls_logit),
        "null_margin": float(null),
        "span_log_prob": float(best),
        "span_top_prob": float(scores.best_probability),
    }


def wanted_features(names: Sequence[str], verifier: Linear | None = None) -> set[str]:
    """Every feature deciding on ``names`` computes: those, and the verifier's inputs when its logit is one."""
    return set(names) | (
        set(verifier.features) if verifier is not None and VERIFIER_LOGIT in names else set()
    )


def prepare_question(
    question: str, index: ContextIndex, names: Sequence[str], verifier: Linear | None
) -> QuestionMatch:
    """Compute ahead what :func:`all_features` will read of ``question`` and the context alone (their
    match, the verifier's features, kept in the match returned): a server does this while the engine
    runs, then hands the match back with :meth:`ContextIndex.keep` just before decoding, so that
    decoding only reads them. The features are the same either way."""
    m = match_question(question, index)
    wanted = wanted_features(names, verifier)
    if wanted - set(MODEL_FEATURES):
        question_features(question, index, m, wanted)
    if verifier is not None and VERIFIER_LOGIT in names:
        verifier_logit(question, index, m, verifier, wanted)
    return m


def all_features(
    question: str,
    context: str | ContextIndex,
    scores: SpanScores,
    names: Sequence[str],
    verifier: Linear | None = None,
) -> dict[str, float]:
    """The features ``names`` of one decoded question (the lexical ones only when asked for: they
    cost a pass over the context). ``verifier_logit`` needs the question ``verifier``."""
    if VERIFIER_LOGIT in names and verifier is None:
        raise AnswerabilityError(f"{VERIFIER_LOGIT} is a feature but there is no question verifier")
    out = model_features(scores)
    wanted = wanted_features(names, verifier)
    if wanted - set(MODEL_FEATURES):  # always so when the verifier's logit is wanted: it reads these
        index = context if isinstance(context, ContextIndex) else ContextIndex(context)
        m = match_question(question, index)
        out |= question_features(question, index, m, wanted)
        read = scores.best_span_read
        if read is not None and (read.start, read.end) == (scores.best_start, scores.best_end):
            out |= read.features
        else:
            out |= span_features(question, index, m, scores.best_start, scores.best_end)
        if verifier is not None and VERIFIER_LOGIT in names:
            out[VERIFIER_LOGIT] = verifier_logit(question, index, m, verifier, wanted)
    return {n: out[n] for n in names}
