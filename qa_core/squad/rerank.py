"""Re-ranking the reader's top spans: which of its first few candidates to answer with.

A small reader often ranks the right span second or fifth: its scores know where answers start and
end, not whether the span sits next to the question's words or is the kind of thing the question asks
for. A :class:`SpanReranker` rescores the top ``top_k`` candidates of a decoded question with a linear
model over evidence of both kinds (the reader's own scores relative to its best, and lexical evidence
from the question, the span and its sentence) and puts them in that order; the rest follow unchanged.
Spans are first snapped to whole words (a sub-word piece of "1973's" becomes the word), and spans that
snapping makes equal are listed once.

The numbers are fitted on the training side (:mod:`train.answerability.rerank_fit`, scikit-learn) on
articles the reader never trained on, and stored beside the answerability rule; applying them here is
numpy only, so evaluation, the exporters' checks and every server backend rank spans the same way.
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qa_core.text import STOPWORDS, stem, words

from .answerability_features import (
    SPAN_FEATURES,
    ContextIndex,
    QuestionMatch,
    SentenceWords,
    SpanReading,
    kind_match,
    match_question,
)
from .answerability_params import AnswerabilityError, Linear, check_format, parse_number, parse_object
from .candidates import TOP_K, NBestEntry
from .trees import BoostedTrees, is_trees

FORMAT = 1
# TOP_K (candidates.py): candidates rescored; the best of the top 10 holds most of what the top 20 does
CANDIDATE_FEATURES = (
    "score_gap",  # the span's log-probability minus the best span's (<= 0)
    "log_rank",  # log(1 + the reader's rank)
    "probability",  # the span's share of the probability mass of the best TOP_K spans as decoded
    "span_words",  # log(1 + words in the span)
    "in_best_sentence",  # the span lies in the sentence that holds most of the question's words
    "sentence_coverage",  # share of the question's (rarity-weighted) words in the span's sentence
    "coverage_gap",  # the best sentence's coverage minus the span's sentence's
    "in_question",  # share of the span's content words that the question already says
    "type_match",  # the span is the kind of answer the wh-word asks for (0.5: the question does not say)
    "near_question",  # 1 / (1 + words between the span and the nearest question word of its sentence)
    "content_free",  # the span has no content word (stopwords, punctuation)
)


# the columns that are the answerability rule's SPAN_FEATURES, in its order (answerability_features.py
# computes them from the span alike: tests/test_decode_bounds.py checks they agree)
_SPAN_COLUMNS = [
    CANDIDATE_FEATURES.index(c)
    for c in ("in_best_sentence", "type_match", "in_question", "sentence_coverage")
]


def snap_to_words(context: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` widened to whole words: a span that begins or ends inside a run of letters and
    digits takes the whole run (punctuation and spaces are never added)."""
    while start > 0 and context[start - 1].isalnum() and context[start].isalnum():
        start -= 1
    while end < len(context) and context[end - 1].isalnum() and context[end].isalnum():
        end += 1
    return start, end


def snapped(context: str, entries: Sequence[NBestEntry]) -> list[NBestEntry]:
    """Each entry snapped to whole words, best first, spans made equal by snapping listed once. The
    decoder has already found each span's whole-word extent within max_answer_len tokens
    (``word_start``/``word_end``); an entry made elsewhere is snapped here, by characters."""
    out: list[NBestEntry] = []
    seen: set[tuple[int, int]] = set()
    for e in entries:
        a, b = (e.word_start, e.word_end) if e.word_start >= 0 else snap_to_words(context, e.start, e.end)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        if (a, b) != (e.start, e.end):
            e = copy.copy(e)  # a plain copy: dataclasses.replace re-runs __init__ per span
            e.text, e.start, e.end = context[a:b], a, b
        out.append(e)
    return out


class _QuestionNearness:
    """Where the question's words sit in each sentence, found once per sentence a candidate lies in: a
    question's ten candidates share a few sentences."""

    def __init__(self, index: ContextIndex, q_stems: set[str]) -> None:
        self.index, self.q_stems = index, q_stems
        self._sentences: dict[int, tuple[SentenceWords, list[int]]] = {}  # its words, question words' places

    def __call__(self, sentence: int, start: int, end: int) -> float:
        """How close ``[start, end)`` sits to a question word of its own sentence (1: adjacent; 0: none
        there). Distances count words between them."""
        found = self._sentences.get(sentence)
        if found is None:
            words_of = self.index.word_positions(sentence)
            hits = [i for i, s in enumerate(words_of.stems) if s in self.q_stems]
            found = self._sentences[sentence] = (words_of, hits)
        words_of, hits = found
        if not hits:
            return 0.0
        first = bisect.bisect_left(words_of.ends, start + 1)  # first word ending inside or after the span
        last = bisect.bisect_left(words_of.starts, end)  # words before it start before the span ends
        # the nearest question word before the span is the last one before ``first``, the nearest after
        # it the first one from ``last`` on (hits are in order; those inside the span do not count)
        before, after = bisect.bisect_left(hits, first), bisect.bisect_left(hits, last)
        if after < len(hits):
            gap = hits[after] - last
            return 1.0 / (1.0 + (min(gap, first - hits[before - 1] - 1) if before else gap))
        return 1.0 / (1.0 + (first - hits[before - 1] - 1)) if before else 0.0


def candidate_features(
    question: str, index: ContextIndex, m: QuestionMatch, entries: Sequence[NBestEntry]
) -> np.ndarray:
    """The evidence about each candidate, one row each in the order given (entries[0] is the reader's
    best), one column per name of ``CANDIDATE_FEATURES``. What depends on the question alone (its stems,
    the kind of answer it asks for) is read once."""
    best_score = entries[0].score if entries else 0.0
    best_coverage = max(m.coverage) if m.coverage else 0.0
    q_stems = set(m.stems)
    kind = m.kind
    near = _QuestionNearness(index, q_stems)
    context = index.context
    rows = []
    for rank, e in enumerate(entries):
        span = context[e.start : e.end]
        span_words = words(span)
        content = [stem(w) for w in span_words if w not in STOPWORDS]
        sentence = index.sentence_of(e.start, e.end)
        coverage = m.coverage[sentence] if m.coverage else 0.0
        rows.append(
            (
                max(e.score - best_score, -30.0),  # score_gap
                math.log1p(rank),  # log_rank
                e.share,  # probability
                math.log1p(len(span_words)),  # span_words
                float(sentence == m.best),  # in_best_sentence
                coverage,  # sentence_coverage
                best_coverage - coverage,  # coverage_gap
                len([s for s in content if s in q_stems]) / len(content) if content else 0.0,  # in_question
                kind_match(kind, span, span_words) if kind else 0.5,  # type_match (0.5: not said)
                near(sentence, e.start, e.end),  # near_question
                float(not content),  # content_free
            )
        )
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(CANDIDATE_FEATURES))


@dataclass(frozen=True)
class SpanReranker:
    """A fitted re-ranker: the top ``top_k`` spans, whole words, ordered by ``model``'s logit."""

    # a candidate's score, higher for spans likelier right (fitted on its F1 with the gold answers): a
    # logistic model's logit, or boosted trees' regression of the F1
    model: Linear | BoostedTrees
    top_k: int = TOP_K
    report: dict[str, Any] | None = None

    def rerank(
        self, question: str, context: str | ContextIndex, entries: Sequence[NBestEntry]
    ) -> list[NBestEntry]:
        """``entries`` (the reader's n-best, best first) snapped to words, the first ``top_k``
        reordered by the model (ties keep the reader's order), the rest after them unchanged."""
        return self.rerank_reading(question, context, entries)[0]

    def rerank_reading(
        self, question: str, context: str | ContextIndex, entries: Sequence[NBestEntry]
    ) -> tuple[list[NBestEntry], SpanReading | None]:
        """:meth:`rerank`'s list, and what the answerability rule reads about its first span
        (``SPAN_FEATURES``, equal to ``span_features``' by construction: the same evidence, read off
        the re-ranker's own columns instead of computed again); None when fewer than two spans were
        left to rank (nothing was read)."""
        index = context if isinstance(context, ContextIndex) else ContextIndex(context)
        head = snapped(index.context, entries[: self.top_k])  # the reader's first top_k, whatever follows
        taken = {(e.start, e.end) for e in head}
        tail = [e for e in snapped(index.context, entries[self.top_k :]) if (e.start, e.end) not in taken]
        if len(head) < 2:
            return head + tail, None
        x, scores = self._scored(question, index, head)
        order = sorted(range(len(head)), key=lambda i: -scores[i])
        best = head[order[0]]
        read = dict(zip(SPAN_FEATURES, x[order[0], _SPAN_COLUMNS].tolist(), strict=True))
        return [head[i] for i in order] + tail, SpanReading(best.start, best.end, read)

    def scores(self, question: str, index: ContextIndex, head: Sequence[NBestEntry]) -> list[float]:
        """The model's score of each of ``head`` (snapped spans), in their order."""
        return self._scored(question, index, head)[1]

    def _scored(
        self, question: str, index: ContextIndex, head: Sequence[NBestEntry]
    ) -> tuple[np.ndarray, list[float]]:
        """``head``'s candidate features (one row each) and the model's score of each."""
        x = candidate_features(question, index, match_question(question, index), head)
        return x, self.model.on_columns(x, CANDIDATE_FEATURES).tolist()

    def summary(self) -> str:
        """One line: what it was fitted on and, per article, the span F1 it gave out of fold."""
        r = self.report or {}
        line = f"span re-ranker (top {self.top_k}) fitted on {r.get('questions', '?')} answerable questions"
        cross = r.get("cross_fitted") or {}
        if cross:
            per = ", ".join(f"{t} {v['reader']:.1f} -> {v['reranked']:.1f}" for t, v in cross.items())
            line += f"; span F1 of the reader's best -> re-ranked, each article ranked by a model fitted on the others: {per}"
        return line

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "top_k": self.top_k, "model": self.model.to_dict()}
        if self.report:
            out["report"] = self.report
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> SpanReranker:
        """Validate stored numbers; AnswerabilityError says what is wrong."""
        raw = parse_object(raw, "reranker")
        check_format(raw, "reranker", FORMAT)
        top_k = parse_number(raw.get("top_k", TOP_K), "reranker.top_k")
        if top_k != int(top_k) or not 2 <= top_k <= 100:
            raise AnswerabilityError("reranker.top_k must be a whole number from 2 to 100")
        stored = raw.get("model")
        model: Linear | BoostedTrees = (
            BoostedTrees.from_dict(stored, "reranker.model", CANDIDATE_FEATURES)
            if is_trees(stored)
            else Linear.from_dict(stored, "reranker.model", CANDIDATE_FEATURES)
        )
        report = raw.get("report")
        return cls(model, int(top_k), dict(report) if isinstance(report, Mapping) else None)
