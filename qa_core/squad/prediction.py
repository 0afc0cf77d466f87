"""A decoded question: its n-best spans, the answer decided from them, and a re-decision.

Kept apart from the decoders so that what they return (and what evaluation, the server and the
answerability fit read) can be used without the decoding machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qa_core.contract import DEFAULTS

from .answerability import Answerability, decide
from .answerability_features import ContextIndex, SpanReading, SpanScores
from .candidates import NBestEntry
from .rerank import SpanReranker


@dataclass
class Prediction:
    """The decoded answer to one question.

    ``text`` is "" and ``start == end == -1`` when the question is judged unanswerable (or no span
    was valid); ``n_best`` (best first) still holds the spans, ``n_best[0]`` being the best one.
    """

    qas_id: str
    text: str
    start: int
    end: int
    score: float
    no_answer_prob: float
    null_logit: float
    is_impossible: bool
    n_best: list[NBestEntry] = field(default_factory=list)
    answerable_prob: float = 0.5  # calibrated when the model carries a fitted answerability model
    threshold: float = DEFAULTS.no_answer_threshold  # the threshold on no_answer_prob it was decided at
    null_log_prob: float | None = None  # best window's log P(start = end = <cls>); None for the beam head
    reranked: bool = False  # n_best is in a re-ranker's order (spans snapped to words), not the reader's
    expected_f1: float | None = None  # the expected-gain rule's E[F1 of the best span]; else None

    @property
    def best_span_text(self) -> str:
        """The best non-null span's text, whatever the threshold decided ("" if there is none)."""
        return self.n_best[0].text if self.n_best else ""

    def span_scores(self) -> SpanScores:
        """The decoder's numbers for this question: what an answerability model reads."""
        return _span_scores(self.n_best, self.null_logit, self.null_log_prob)

    def reranked_by(self, reranker: SpanReranker, question: str, context: str | ContextIndex) -> Prediction:
        """The spans in the re-ranker's order (once: the reader's order is what it reads)."""
        if self.reranked or not self.n_best:
            return self
        spans = reranker.rerank(question, context, self.n_best)
        return replace(self, n_best=spans, score=spans[0].score, reranked=True)

    def redecided(self, deciding: Deciding, context: str) -> Prediction:
        """This prediction decided again under another answerability model or threshold (the spans
        and scores are kept: no model run is needed to compare decision rules). A rule that holds a
        re-ranker orders the spans first, unless they already are. One copy of the prediction is made:
        decoding calls this for every question the server answers."""
        rule = deciding.rule()
        where: str | ContextIndex = deciding.index or context
        spans, reranked = self.n_best, self.reranked
        best_read: SpanReading | None = None  # what the re-ranker read of its best span
        if rule.reranker is not None and not reranked and spans:
            where = where if isinstance(where, ContextIndex) else ContextIndex(where)
            spans, best_read = rule.reranker.rerank_reading(deciding.question, where, spans)
            reranked = True
        scores = _span_scores(spans, self.null_logit, self.null_log_prob, best_read)
        d = decide(rule, deciding.question, where, scores, deciding.threshold)
        best = None if d.is_impossible or not spans else spans[0]
        return Prediction(  # every field named (dataclasses.replace would read them all again by name)
            qas_id=self.qas_id,
            text=best.text if best is not None else "",
            start=best.start if best is not None else -1,
            end=best.end if best is not None else -1,
            score=spans[0].score if spans is not self.n_best else self.score,  # re-ranked here: its best's
            no_answer_prob=d.no_answer_prob,
            null_logit=self.null_logit,
            is_impossible=d.is_impossible,
            n_best=spans,
            answerable_prob=d.answerable_prob,
            threshold=d.threshold,
            null_log_prob=self.null_log_prob,
            reranked=reranked,
            expected_f1=d.expected_f1,
        )

    @property
    def margin(self) -> float | None:
        """How far P(no answer) lies below the threshold it was decided at (negative: above it, so no
        answer); None when there is no span to answer with."""
        return self.threshold - self.no_answer_prob if self.n_best else None

    def reason(self, rule: str) -> str:
        """Why it answered or abstained, in one line, from the rule's inputs: ``rule`` names what set the
        threshold (AnswerResponse.rule: request, server, cls, threshold, expected_gain, none)."""
        if not self.n_best:
            return "no answer: the context has no valid span"
        if rule == "none":
            return (
                "no answer: this model's fitted rule answers no question (it did not beat answering none); "
                "send a threshold (1.0: always the best span) to answer"
            )
        verdict = "no answer" if self.is_impossible else "answered"
        if rule == "expected_gain" and self.expected_f1 is not None:
            p, g = self.answerable_prob, self.expected_f1
            sign = "<=" if self.is_impossible else ">"
            return (
                f"{verdict}: P(answerable) {p:.2f} x expected F1 of the best span {g:.2f} = {p * g:.2f} "
                f"{sign} P(no answer) {1 - p:.2f} (expected gain)"
            )
        who = {"request": "the request", "server": "the server", "cls": "the model", "threshold": "the model"}
        sign = ">" if self.is_impossible else "<="
        return (
            f"{verdict}: P(no answer) {self.no_answer_prob:.2f} {sign} threshold {self.threshold:.2f} "
            f"(set by {who.get(rule, rule)})"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (plain Python numbers)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Prediction:
        """The prediction :meth:`to_dict` wrote (a study's cached out-of-fold outputs are re-read so,
        not decoded again)."""
        return cls(**{**d, "n_best": [NBestEntry(**e) for e in d.get("n_best", [])]})


def _span_scores(
    n_best: list[NBestEntry],
    null_logit: float,
    null_log_prob: float | None,
    best_span_read: SpanReading | None = None,
) -> SpanScores:
    best = n_best[0] if n_best else None
    return SpanScores(
        cls_logit=null_logit,
        null_log_prob=null_log_prob,
        best_log_prob=best.score if best is not None else None,
        best_probability=best.share if best is not None else 0.0,
        best_start=best.start if best is not None else -1,
        best_end=best.end if best is not None else -1,
        best_span_read=best_span_read,
    )


@dataclass(frozen=True)
class Deciding:
    """How a decoded question is decided: the model's answerability (None: sigmoid(cls) against
    ``threshold``), the question's text (for a verifier's lexical features), and the caller's own
    threshold on the no-answer probability, which replaces the stored rule."""

    answerability: Answerability | None = None
    question: str = ""
    threshold: float | None = None
    index: ContextIndex | None = None  # the context's stems and sentences, shared by its questions

    def rule(self) -> Answerability:
        if self.answerability is not None:
            return self.answerability
        return Answerability.cls_only(
            DEFAULTS.no_answer_threshold if self.threshold is None else self.threshold
        )


def answers_and_na_probs(
    predictions: Mapping[str, Prediction], apply_threshold: bool = False
) -> tuple[dict[str, str], dict[str, float]]:
    """``(answers, na_probs)`` for :func:`train.squad.metrics.evaluate`.

    By default the answers are the best spans (never ""), as the original XLNet writes them, and the
    no-answer decision is left to ``evaluate(..., na_probs, na_prob_thresh=t)``, which then reports
    the score at ``t`` and the best threshold. ``apply_threshold=True`` gives the decided answers.
    """
    answers = {q: (p.text if apply_threshold else p.best_span_text) for q, p in predictions.items()}
    return answers, {q: p.no_answer_prob for q, p in predictions.items()}
