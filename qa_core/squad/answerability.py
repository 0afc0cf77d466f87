"""Is the question answerable? One decision rule for evaluation, export and every server backend.

A question's answerability is decided from a few numbers:

* the model's own scores: the `<cls>` "unanswerable" logit (minimum over windows), the null span's
  log-probability against the best span's, how sure the best span is;
* a question verifier: a logistic model over lexical evidence that needs no QA model at all (does a
  sentence of the context hold the question's content words, names and numbers; does a negation or an
  antonym separate the question from that sentence), fitted on the fine-tuning questions;
* for the expected-gain rule, evidence about the best span (is it in the sentence the question
  matches best, is it the kind of answer the wh-word asks for).

An :class:`Answerability` combines them into a calibrated ``P(answerable)`` (logistic model, then
Platt or isotonic calibration) and decides:

* ``threshold``: no answer when ``1 - P(answerable) > threshold`` (the SQuAD convention on the
  no-answer probability);
* ``expected_gain``: answer when ``P(answerable) * E[F1 of the span] > 1 - P(answerable)``: answering
  pays the span's F1 when the question is answerable and costs 1 when it is not;
* ``none``: never answer, whatever the probabilities (what a fit stores when no rule credibly beat
  answering none; no calibration can turn it into answers).

:meth:`Answerability.decision` is the one place a question is decided: the server, evaluation and
the training side's fits all call it.

Everything here is numpy and plain JSON: the numbers are fitted on the training side
(:mod:`train.answerability.fit`, scikit-learn) and stored in the checkpoint's metadata and the
export's sidecar; the server only applies them. A model without a fitted one gets
:meth:`Answerability.cls_only`: ``sigmoid(min over windows of cls_logit)`` against a threshold.

This module holds the rule and its stored form; the evidence is computed in
:mod:`.answerability_features` and the stored numbers are validated in :mod:`.linear`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .answerability_features import (
    FEATURES,
    MODEL_FEATURES,
    QUESTION_FEATURES,
    SPAN_FEATURES,
    VERIFIER_LOGIT,
    ContextIndex,
    QuestionMatch,
    SpanScores,
    all_features,
    prepare_question,
)
from .answerability_params import (
    AnswerabilityError,
    Linear,
    check_format,
    parse_curve,
    parse_number,
    parse_object,
)
from .candidates import TOP_K
from .rerank import SpanReranker

FORMAT = 1
FITTED_RULES = ("threshold", "expected_gain")  # the rules a fit chooses between
NONE_RULE = "none"  # stored when no rule credibly beat answering none: it never answers
RULES = (*FITTED_RULES, NONE_RULE)
CALIBRATIONS = ("none", "platt", "isotonic")


def sigmoid(x: float) -> float:
    """Numerically stable logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


@dataclass(frozen=True)
class Decision:
    """What the rule decided for one question."""

    answerable_prob: float
    no_answer_prob: float
    threshold: float  # the threshold on no_answer_prob this question was decided at
    is_impossible: bool
    expected_f1: float | None = None  # the expected-gain rule's E[F1 of the best span] (None: another rule)


@dataclass(frozen=True)
class SpanF1:
    """E[F1 of the best span | span evidence]: a linear score, then an isotonic map to [0, 1]."""

    score: Linear
    curve: tuple[tuple[float, ...], tuple[float, ...]]

    def __call__(self, feats: Mapping[str, float]) -> float:
        return float(np.interp(self.score(feats), *self._curve))

    @functools.cached_property
    def _curve(self) -> tuple[np.ndarray, np.ndarray]:
        """The curve as arrays, made once (np.interp would convert the stored tuples per question)."""
        return np.array(self.curve[0]), np.array(self.curve[1])

    def to_dict(self) -> dict[str, Any]:
        return self.score.to_dict() | {"x": list(self.curve[0]), "y": list(self.curve[1])}

    @classmethod
    def from_dict(cls, raw: Any, name: str) -> SpanF1:
        allowed = MODEL_FEATURES + SPAN_FEATURES
        return cls(Linear.from_dict(raw, name, allowed), parse_curve(raw, name))


@dataclass(frozen=True)
class Answerability:
    """A fitted answerability model: features -> logit -> calibration -> P(answerable) -> rule."""

    model: Linear  # logit of "answerable"
    verifier: Linear | None = None  # the question verifier, whose logit is the feature verifier_logit
    calibration: str = "none"
    platt: tuple[float, float] = (1.0, 0.0)  # P = 1 / (1 + exp(a * logit + b)) (scikit-learn's sigmoid)
    isotonic: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    rule: str = "threshold"
    threshold: float = 0.5  # on 1 - P(answerable), for the threshold rule
    span_f1: SpanF1 | None = None  # for the expected-gain rule
    reranker: SpanReranker | None = None  # orders the spans before the best one is decided on
    report: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def cls_only(cls, threshold: float, reranker: SpanReranker | None = None) -> Answerability:
        """The model's own answerability: P(answerable) = 1 - sigmoid(min cls_logit), a threshold on it."""
        model = Linear(("cls_logit",), (0.0,), (1.0,), (-1.0,), 0.0)
        return cls(model, threshold=threshold, reranker=reranker, report={"kind": "cls"})

    @functools.cached_property
    def features(self) -> tuple[str, ...]:
        """Every feature the decision reads (the combining model's, then the span model's); once, as
        every decided question asks."""
        extra = self.span_f1.score.features if self.span_f1 is not None else ()
        return tuple(dict.fromkeys(self.model.features + extra))

    @functools.cached_property
    def _isotonic(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.isotonic[0]), np.array(self.isotonic[1])

    @property
    def spans_read(self) -> int:
        """How many of the reader's best spans deciding reads (the re-ranker's head and the mass a span's
        share is taken over): spans past these change no answer, so a server need not decode them."""
        return max(TOP_K, self.reranker.top_k if self.reranker is not None else 0)

    @property
    def uses_lexical(self) -> bool:
        """Whether deciding reads the context's sentences (a lexical feature, or the re-ranker)."""
        return self.reranker is not None or any(f not in MODEL_FEATURES for f in self.features)

    # -- applying
    def prepare(self, question: str, index: ContextIndex) -> QuestionMatch | None:
        """Compute ahead what deciding ``question`` reads of it and the context alone (their match, the
        verifier's features, in the match returned; None: deciding reads nothing lexical), so that
        deciding after the engine only reads them (handed back with ``index.keep``): the server does
        this while the engine runs. Decisions are the same with or without it."""
        if not self.uses_lexical:
            return None
        return prepare_question(question, index, self.features, self.verifier)

    def probabilities(self, feats: Mapping[str, float]) -> tuple[float, float]:
        """``(P(answerable), P(no answer))``, each computed without cancellation."""
        s = self.model(feats)
        if self.calibration == "platt":
            a, b = self.platt
            return sigmoid(-(a * s + b)), sigmoid(a * s + b)
        if self.calibration == "isotonic":
            p = min(1.0, max(0.0, float(np.interp(s, *self._isotonic))))
            return p, 1.0 - p
        return sigmoid(s), sigmoid(-s)

    def expected_f1(self, feats: Mapping[str, float]) -> float | None:
        """The expected-gain rule's input: E[F1 of the best span] (None under another rule)."""
        return self.span_f1(feats) if self.rule == "expected_gain" and self.span_f1 is not None else None

    def no_answer_threshold(self, feats: Mapping[str, float], expected_f1: float | None = None) -> float:
        """The threshold on ``1 - P(answerable)`` this question is decided at: the stored one, or for
        the expected-gain rule ``g / (1 + g)`` with g the span's expected F1 (answer iff p·g > 1 - p;
        ``expected_f1``: g when the caller has it already); 0 for the ``none`` rule (which
        :meth:`decision` never answers, whatever the probability)."""
        if self.rule == NONE_RULE:
            return 0.0
        g = expected_f1 if expected_f1 is not None else self.expected_f1(feats)
        return g / (1.0 + g) if g is not None else self.threshold

    def decision(
        self, feats: Mapping[str, float], has_span: bool, threshold: float | None = None
    ) -> Decision:
        """Decide one question from its features: no answer when ``P(no answer)`` exceeds the
        question's threshold, when there is no span to answer with, or always under the ``none``
        rule. ``threshold`` (a caller's own, on the no-answer probability) replaces the stored rule."""
        p, no_answer = self.probabilities(feats)
        g = self.expected_f1(feats) if threshold is None else None  # a caller's threshold replaces the rule
        thr = self.no_answer_threshold(feats, g) if threshold is None else threshold
        never = threshold is None and self.rule == NONE_RULE
        return Decision(p, no_answer, thr, never or no_answer > thr or not has_span, g)

    # -- storing
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "model": self.model.to_dict()}
        if self.verifier is not None:
            out["verifier"] = self.verifier.to_dict()
        out |= {"calibration": self.calibration, "rule": self.rule, "threshold": self.threshold}
        if self.calibration == "platt":
            out["platt"] = {"a": self.platt[0], "b": self.platt[1]}
        if self.calibration == "isotonic":
            out["isotonic"] = {"x": list(self.isotonic[0]), "y": list(self.isotonic[1])}
        if self.span_f1 is not None:
            out["span_f1"] = self.span_f1.to_dict()
        if self.reranker is not None:
            out["reranker"] = self.reranker.to_dict()
        if self.report:
            out["report"] = self.report
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Answerability:
        """Validate stored numbers (from metadata or a sidecar); AnswerabilityError says what is wrong."""
        raw = parse_object(raw, "answerability")
        check_format(raw, "answerability", FORMAT)
        model = Linear.from_dict(raw.get("model"), "answerability.model", FEATURES)
        verifier = None
        if raw.get("verifier") is not None:
            verifier = Linear.from_dict(raw["verifier"], "answerability.verifier", QUESTION_FEATURES)
        if VERIFIER_LOGIT in model.features and verifier is None:
            raise AnswerabilityError(f"answerability.model reads {VERIFIER_LOGIT} but there is no verifier")
        calibration, rule = raw.get("calibration", "none"), raw.get("rule", "threshold")
        if calibration not in CALIBRATIONS:
            raise AnswerabilityError(f"answerability.calibration must be one of {CALIBRATIONS}")
        if rule not in RULES:
            raise AnswerabilityError(f"answerability.rule must be one of {RULES}")
        threshold = parse_number(raw.get("threshold", 0.5), "answerability.threshold")
        if not 0.0 <= threshold <= 1.0:
            raise AnswerabilityError("answerability.threshold must lie in [0, 1]")
        platt = (1.0, 0.0)
        if calibration == "platt":
            p = parse_object(raw.get("platt"), "answerability.platt")
            platt = (
                parse_number(p.get("a"), "answerability.platt.a"),
                parse_number(p.get("b"), "answerability.platt.b"),
            )
        isotonic = (
            parse_curve(raw.get("isotonic"), "answerability.isotonic")
            if calibration == "isotonic"
            else ((), ())
        )
        span_f1 = None
        if rule == "expected_gain" or raw.get("span_f1") is not None:
            span_f1 = SpanF1.from_dict(raw.get("span_f1"), "answerability.span_f1")
        reranker = SpanReranker.from_dict(raw["reranker"]) if raw.get("reranker") is not None else None
        report = raw.get("report", {})
        return cls(
            model=model,
            verifier=verifier,
            calibration=calibration,
            platt=platt,
            isotonic=isotonic,
            rule=rule,
            threshold=threshold,
            span_f1=span_f1,
            reranker=reranker,
            report=dict(report) if isinstance(report, Mapping) else {},
        )


def from_metadata(metadata: Mapping[str, Any] | None) -> Answerability:
    """The answerability a checkpoint's metadata or an export's sidecar carries: its fitted model, or
    the cls-only rule at its ``no_answer_threshold`` (the default when it has neither)."""
    meta = metadata or {}
    raw = meta.get("answerability")
    if raw is not None:
        return Answerability.from_dict(raw)
    threshold = meta.get("no_answer_threshold")
    return Answerability.cls_only(0.5 if threshold is None else float(threshold))


def decide(
    answerability: Answerability,
    question: str,
    context: str | ContextIndex,
    scores: SpanScores,
    threshold: float | None = None,
) -> Decision:
    """Apply the rule to one decoded question. ``threshold`` (a caller's own, on the no-answer
    probability) replaces the stored rule; a question without any valid span is never answered."""
    a = answerability
    feats = all_features(question, context, scores, a.features, a.verifier)
    return a.decision(feats, scores.best_log_prob is not None, threshold)
