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
  pays the span's F1 when the question is answerable and costs 1 when it is not.

Everything here is numpy and plain JSON: the numbers are fitted on the training side
(:mod:`train.recipes.answerability`, scikit-learn) and stored in the checkpoint's metadata and the
export's sidecar; the server only applies them. A model without a fitted one gets
:meth:`Answerability.cls_only`: ``sigmoid(min over windows of cls_logit)`` against a threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from train.common.text import (
    ANTONYMS,
    MONTHS,
    STOPWORDS,
    WORD,
    capitalised,
    content_stems,
    has_negation,
    numbers,
    sentence_bounds,
    stem,
    words,
)

FORMAT = 1
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
)
# Evidence about the best span (how likely it is to be right, for the expected-gain rule).
SPAN_FEATURES = ("span_in_best_sentence", "answer_type_match", "span_in_question")
VERIFIER_LOGIT = "verifier_logit"  # the question verifier's output, an input of the combining model
FEATURES = MODEL_FEATURES + QUESTION_FEATURES + SPAN_FEATURES + (VERIFIER_LOGIT,)
RULES = ("threshold", "expected_gain")
CALIBRATIONS = ("none", "platt", "isotonic")
NO_SPAN_LOG_PROB = -30.0  # span_log_prob when no valid span exists (far below any real span)


class AnswerabilityError(ValueError):
    """Stored answerability numbers that cannot be applied; the message says which and why."""


def sigmoid(x: float) -> float:
    """Numerically stable logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


# ---------------------------------------------------------------- features
@dataclass(frozen=True)
class SpanScores:
    """What the decoder knows about one question: its model scores and its best span (None: none)."""

    cls_logit: float  # min over windows of the "unanswerable" logit
    null_log_prob: float | None  # best window's log P(start=end=<cls>); None for heads without it
    best_log_prob: float | None  # best span's log P(start) + log P(end); None when there is no span
    best_probability: float  # the best span's share of the n-best probability mass (0 with none)
    best_start: int = -1  # characters of the context
    best_end: int = -1


class ContextIndex:
    """Sentences, stems and word rarity of one context, computed once for all its questions."""

    def __init__(self, context: str) -> None:
        self.context = context
        self.sentences = sentence_bounds(context) or [(0, len(context))]
        self.sentence_stems = [set(content_stems(context[a:b])) for a, b in self.sentences]
        self.sentence_words = [set(words(context[a:b])) for a, b in self.sentences]
        self.stems: set[str] = set().union(*self.sentence_stems)
        self.words: set[str] = set().union(*self.sentence_words)
        self.numbers = numbers(context)
        df: dict[str, int] = {}
        for s in self.sentence_stems:
            for w in s:
                df[w] = df.get(w, 0) + 1
        n = len(self.sentences)
        self.idf = {w: math.log(1.0 + n / c) for w, c in df.items()}
        self.unseen_idf = math.log(1.0 + n)  # a word of no sentence is as rare as can be

    def sentence_of(self, start: int, end: int) -> int:
        """Index of the sentence holding most of ``[start, end)`` (the first one if none does)."""
        best, overlap = 0, -1
        for i, (a, b) in enumerate(self.sentences):
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


def match_question(question: str, index: ContextIndex) -> QuestionMatch:
    stems = list(dict.fromkeys(content_stems(question)))
    weights = {s: index.idf.get(s, index.unseen_idf) for s in stems}
    total = sum(weights.values()) or 1.0
    coverage = [sum(weights[s] for s in stems if s in ss) / total for ss in index.sentence_stems]
    return QuestionMatch(stems, weights, coverage, int(np.argmax(coverage)))


def question_features(question: str, index: ContextIndex, m: QuestionMatch | None = None) -> dict[str, float]:
    """The question verifier's evidence (no QA model involved)."""
    m = m or match_question(question, index)
    b = m.best
    total = sum(m.weights.values()) or 1.0
    window = set().union(*index.sentence_stems[max(0, b - 1) : b + 2])
    missing = [s for s in m.stems if s not in index.sentence_stems[b]]
    a0, a1 = index.sentences[b]
    sentence = index.context[a0:a1]
    sentence_words = index.sentence_words[b]
    q_words = words(question)
    names = capitalised(question)
    ranked = sorted(m.coverage, reverse=True)
    return {
        "best_sentence_coverage": ranked[0],
        "second_sentence_coverage": ranked[1] if len(ranked) > 1 else 0.0,
        "best_sentence_missing": float(min(6, len(missing))),
        "best_sentence_missing_weight": sum(m.weights[s] for s in missing),
        "window_coverage": sum(m.weights[s] for s in m.stems if s in window) / total,
        "context_coverage": sum(m.weights[s] for s in m.stems if s in index.stems) / total,
        "context_missing": float(min(6, sum(s not in index.stems for s in m.stems))),
        "question_negated": float(has_negation(question)),
        "negation_mismatch": float(has_negation(question) != has_negation(sentence)),
        "antonym_in_sentence": float(
            any(ANTONYMS[w] in sentence_words and w not in sentence_words for w in q_words if w in ANTONYMS)
        ),
        "names_missing_in_sentence": float(min(3, sum(n not in sentence_words for n in names))),
        "names_missing_in_context": float(min(3, sum(n not in index.words for n in names))),
        "numbers_missing_in_sentence": float(min(3, len(numbers(question) - numbers(sentence)))),
        "question_words": float(min(20, len(m.stems))),
    }


_WH_NUMBER = ("how many", "how much", "what percentage", "how long", "how old", "how far", "how large")
_TIME_WORDS = frozenset(m.lower() for m in MONTHS) | {"century", "centuries", "decade", "year", "years"}


def answer_type_match(question: str, span: str) -> float:
    """1 when the span holds the kind of answer the question's wh-phrase asks for (a number for "how
    many", a number or month for "when", a name for "who"), 0 when it does not, 0.5 when the question
    does not say (what, which, ...)."""
    q = " ".join(words(question))
    span_words = set(words(span))
    if any(f" {p} " in f" {q} " for p in _WH_NUMBER):
        return float(bool(numbers(span)))
    if " when " in f" {q} " or "what year" in q or "what century" in q:
        return float(bool(numbers(span)) or bool(span_words & _TIME_WORDS))
    if {"who", "whom", "whose"} & set(q.split()):
        return float(any(w[:1].isupper() and w.lower() not in STOPWORDS for w in WORD.findall(span)))
    return 0.5


def span_features(
    question: str, index: ContextIndex, m: QuestionMatch, start: int, end: int
) -> dict[str, float]:
    """Evidence about the best span ``[start, end)`` (``start < 0``: there is none)."""
    if start < 0:
        return dict.fromkeys(SPAN_FEATURES, 0.0)
    span = index.context[start:end]
    span_stems = [stem(w) for w in words(span) if w not in STOPWORDS]
    q_stems = set(content_stems(question))
    return {
        "span_in_best_sentence": float(index.sentence_of(start, end) == m.best),
        "answer_type_match": answer_type_match(question, span),
        "span_in_question": sum(s in q_stems for s in span_stems) / len(span_stems) if span_stems else 0.0,
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


def all_features(
    question: str,
    context: str | ContextIndex,
    scores: SpanScores,
    names: Sequence[str],
    verifier: Linear | None = None,
) -> dict[str, float]:
    """The features ``names`` of one decoded question (the lexical ones only when asked for: they
    cost a pass over the context). ``verifier_logit`` needs the question ``verifier``."""
    out = model_features(scores)
    wanted = set(names) | (
        set(verifier.features) if verifier is not None and VERIFIER_LOGIT in names else set()
    )
    if wanted - set(MODEL_FEATURES):
        index = context if isinstance(context, ContextIndex) else ContextIndex(context)
        m = match_question(question, index)
        out |= question_features(question, index, m)
        out |= span_features(question, index, m, scores.best_start, scores.best_end)
    if VERIFIER_LOGIT in names:
        if verifier is None:
            raise AnswerabilityError(f"{VERIFIER_LOGIT} is a feature but there is no question verifier")
        out[VERIFIER_LOGIT] = verifier(out)
    return {n: out[n] for n in names}


# ---------------------------------------------------------------- stored numbers
def _floats(value: Any, name: str, n: int | None = None) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)) or (n is not None and len(value) != n):
        want = f"a list of {n} numbers" if n is not None else "a list of numbers"
        raise AnswerabilityError(f"{name} must be {want}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise AnswerabilityError(f"{name} holds a non-finite or non-numeric value {v!r}")
        out.append(float(v))
    return tuple(out)


def _number(value: Any, name: str) -> float:
    return _floats([value], name, 1)[0]


def _object(raw: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise AnswerabilityError(f"{name} must be a JSON object")
    return raw


def _curve(raw: Any, name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A monotone piecewise-linear map (isotonic regression's thresholds) with values in [0, 1]."""
    raw = _object(raw, name)
    x, y = _floats(raw.get("x"), f"{name}.x"), _floats(raw.get("y"), f"{name}.y")
    if len(x) != len(y) or not x:
        raise AnswerabilityError(f"{name}: x and y must be non-empty and of equal length")
    if any(b < a for a, b in zip(x, x[1:], strict=False)):
        raise AnswerabilityError(f"{name}.x must be non-decreasing")
    if any(not 0.0 <= v <= 1.0 for v in y):
        raise AnswerabilityError(f"{name}.y must lie in [0, 1]")
    return x, y


@dataclass(frozen=True)
class Linear:
    """Standardised features -> a weighted sum: a logistic model's logit, or a regression's score."""

    features: tuple[str, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float

    def __call__(self, feats: Mapping[str, float]) -> float:
        x = np.array([feats[f] for f in self.features], dtype=np.float64)
        return float(np.dot((x - np.array(self.center)) / np.array(self.scale), self.coef) + self.intercept)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "center": list(self.center),
            "scale": list(self.scale),
            "coef": list(self.coef),
            "intercept": self.intercept,
        }

    @classmethod
    def from_dict(cls, raw: Any, name: str, allowed: Sequence[str]) -> Linear:
        raw = _object(raw, name)
        names = raw.get("features")
        if not isinstance(names, list) or not names or any(n not in allowed for n in names):
            raise AnswerabilityError(f"{name}.features must be a non-empty list drawn from {tuple(allowed)}")
        n = len(names)
        scale = _floats(raw.get("scale"), f"{name}.scale", n)
        if any(s <= 0 for s in scale):
            raise AnswerabilityError(f"{name}.scale must be positive")
        return cls(
            tuple(names),
            _floats(raw.get("center"), f"{name}.center", n),
            scale,
            _floats(raw.get("coef"), f"{name}.coef", n),
            _number(raw.get("intercept"), f"{name}.intercept"),
        )


@dataclass(frozen=True)
class SpanF1:
    """E[F1 of the best span | span evidence]: a linear score, then an isotonic map to [0, 1]."""

    score: Linear
    curve: tuple[tuple[float, ...], tuple[float, ...]]

    def __call__(self, feats: Mapping[str, float]) -> float:
        return float(np.interp(self.score(feats), self.curve[0], self.curve[1]))

    def to_dict(self) -> dict[str, Any]:
        return self.score.to_dict() | {"x": list(self.curve[0]), "y": list(self.curve[1])}

    @classmethod
    def from_dict(cls, raw: Any, name: str) -> SpanF1:
        allowed = MODEL_FEATURES + SPAN_FEATURES
        return cls(Linear.from_dict(raw, name, allowed), _curve(raw, name))


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
    report: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def cls_only(cls, threshold: float) -> Answerability:
        """The model's own answerability: P(answerable) = 1 - sigmoid(min cls_logit), a threshold on it."""
        model = Linear(("cls_logit",), (0.0,), (1.0,), (-1.0,), 0.0)
        return cls(model, threshold=threshold, report={"kind": "cls"})

    @property
    def features(self) -> tuple[str, ...]:
        """Every feature the decision reads (the combining model's, then the span model's)."""
        extra = self.span_f1.score.features if self.span_f1 is not None else ()
        return tuple(dict.fromkeys(self.model.features + extra))

    @property
    def uses_lexical(self) -> bool:
        return any(f not in MODEL_FEATURES for f in self.features)

    # -- applying
    def probabilities(self, feats: Mapping[str, float]) -> tuple[float, float]:
        """``(P(answerable), P(no answer))``, each computed without cancellation."""
        s = self.model(feats)
        if self.calibration == "platt":
            a, b = self.platt
            return sigmoid(-(a * s + b)), sigmoid(a * s + b)
        if self.calibration == "isotonic":
            p = min(1.0, max(0.0, float(np.interp(s, self.isotonic[0], self.isotonic[1]))))
            return p, 1.0 - p
        return sigmoid(s), sigmoid(-s)

    def no_answer_threshold(self, feats: Mapping[str, float]) -> float:
        """The threshold on ``1 - P(answerable)`` this question is decided at: the stored one, or for
        the expected-gain rule ``g / (1 + g)`` with g the span's expected F1 (answer iff p·g > 1 - p)."""
        if self.rule == "expected_gain" and self.span_f1 is not None:
            g = self.span_f1(feats)
            return g / (1.0 + g)
        return self.threshold

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
        if self.report:
            out["report"] = self.report
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Answerability:
        """Validate stored numbers (from metadata or a sidecar); AnswerabilityError says what is wrong."""
        raw = _object(raw, "answerability")
        if raw.get("format") != FORMAT:
            raise AnswerabilityError(f"answerability.format {raw.get('format')!r} is not {FORMAT}")
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
        threshold = _number(raw.get("threshold", 0.5), "answerability.threshold")
        if not 0.0 <= threshold <= 1.0:
            raise AnswerabilityError("answerability.threshold must lie in [0, 1]")
        platt = (1.0, 0.0)
        if calibration == "platt":
            p = _object(raw.get("platt"), "answerability.platt")
            platt = (
                _number(p.get("a"), "answerability.platt.a"),
                _number(p.get("b"), "answerability.platt.b"),
            )
        isotonic = (
            _curve(raw.get("isotonic"), "answerability.isotonic") if calibration == "isotonic" else ((), ())
        )
        span_f1 = None
        if rule == "expected_gain" or raw.get("span_f1") is not None:
            span_f1 = SpanF1.from_dict(raw.get("span_f1"), "answerability.span_f1")
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


@dataclass(frozen=True)
class Decision:
    """What the rule decided for one question."""

    answerable_prob: float
    no_answer_prob: float
    threshold: float  # the threshold on no_answer_prob this question was decided at
    is_impossible: bool


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
    p, no_answer = a.probabilities(feats)
    thr = a.no_answer_threshold(feats) if threshold is None else threshold
    return Decision(p, no_answer, thr, no_answer > thr or scores.best_log_prob is None)
