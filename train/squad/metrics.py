"""SQuAD 2.0 scoring: the rules of the official ``evaluate-v2.0.py``, re-implemented.

Kept identical to the official script on purpose, quirks included, so that numbers are comparable
with published ones:

* answers are normalised (lower case, ASCII punctuation removed, the words a/an/the removed,
  whitespace collapsed) before comparison; EM and token F1 take the maximum over the gold answers;
* gold answers that normalise to "" are dropped; a question with no (remaining) gold answer has the
  single gold answer "", which only the empty prediction matches (EM = F1 = 1);
* HasAns/NoAns is decided by whether the question has any answers at all;
* with no-answer probabilities, a question whose probability is *strictly* above ``na_prob_thresh``
  counts as predicted "no answer" whatever its text; ``best_exact``/``best_f1`` come from the
  official ``find_best_thresh`` sweep (ties in probability are visited one question at a time, as in
  the official script).

All scores are percentages; ``total`` counts questions.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from typing import Any

import numpy as np

from qa_core.squad.data import Dataset, SquadExample, examples_from_dataset, load_dataset

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the, collapse whitespace (official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(s: str) -> list[str]:
    """The normalised answer split on whitespace (what token F1 counts)."""
    return normalize_answer(s).split() if s else []


def compute_exact(gold: str, pred: str) -> int:
    """1 if the normalised strings are equal, else 0."""
    return int(normalize_answer(gold) == normalize_answer(pred))


def compute_f1(gold: str, pred: str) -> float:
    """Token-level F1 between normalised answers; if either is empty, 1 only if both are."""
    gold_toks = answer_tokens(gold)
    pred_toks = answer_tokens(pred)
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    num_same = sum((Counter(gold_toks) & Counter(pred_toks)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def gold_answers(answers: Iterable[str]) -> list[str]:
    """The gold list used for scoring: answers that normalise to "" are dropped; none left -> [""]."""
    golds = [a for a in answers if normalize_answer(a)]
    return golds or [""]


def _as_examples(
    examples_or_dataset: Iterable[SquadExample] | Dataset | str | PathLike[str],
) -> list[SquadExample]:
    if isinstance(examples_or_dataset, (dict, str, PathLike)):
        source = "<dataset>" if isinstance(examples_or_dataset, dict) else str(examples_or_dataset)
        return examples_from_dataset(load_dataset(examples_or_dataset), source=source, strict=False)
    return list(examples_or_dataset)


def raw_scores(
    examples: Iterable[SquadExample], predictions: Mapping[str, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-question (exact, f1) before any no-answer threshold; every question needs a prediction."""
    exact: dict[str, float] = {}
    f1: dict[str, float] = {}
    for ex in examples:
        if ex.qas_id not in predictions:
            continue
        exact[ex.qas_id], f1[ex.qas_id] = best_exact_f1(ex.answer_texts, predictions[ex.qas_id])
    return exact, f1


def best_exact_f1(answer_texts: Iterable[str], pred: str) -> tuple[float, float]:
    """One answer's (exact, f1) against the best-matching gold answer ("" when the question has none)."""
    golds = gold_answers(answer_texts)
    return float(max(compute_exact(g, pred) for g in golds)), max(compute_f1(g, pred) for g in golds)


def apply_no_answer_threshold(
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
    na_prob_thresh: float,
) -> dict[str, float]:
    """Scores after predicting "no answer" wherever ``na_prob > na_prob_thresh``."""
    return {
        qid: (float(not has_answer[qid]) if na_probs[qid] > na_prob_thresh else s)
        for qid, s in scores.items()
    }


def find_best_thresh(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """The official threshold sweep: ``(best score in %, its na_prob threshold)``.

    Start with every question answered "no answer" (score = number of unanswerable questions), then
    answer questions in increasing order of no-answer probability: an answerable one gains its
    score, an unanswerable one loses 1 if its prediction is non-empty. The best running score and the
    probability at which it is reached are returned; the threshold is 0.0 if answering nothing wins.
    """
    cur = best = float(sum(1 for qid in has_answer if not has_answer[qid]))
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        # answerable: gain its score; unanswerable: lose the point it had for "no answer" if we now answer
        cur += scores[qid] if has_answer[qid] else (-1.0 if predictions[qid] else 0.0)
        if cur > best:
            best = cur
            best_thresh = na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def _summary(
    exact: Mapping[str, float], f1: Mapping[str, float], qids: list[str]
) -> tuple[float, float, int]:
    total = len(qids)
    return (
        100.0 * sum(exact[q] for q in qids) / total,
        100.0 * sum(f1[q] for q in qids) / total,
        total,
    )


def evaluate(
    examples_or_dataset: Iterable[SquadExample] | Dataset | str | PathLike[str],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """Official SQuAD 2.0 metrics for ``predictions`` (question id -> answer text, "" = no answer).

    ``examples_or_dataset`` is a list of :class:`SquadExample`, a parsed SQuAD document or a path.
    Every question must have a prediction (ValueError otherwise; extra ids are ignored), and an
    ``na_probs`` entry when ``na_probs`` is given. Returns exact, f1, total, then HasAns_* / NoAns_*
    when the set has such questions, then best_exact, best_exact_thresh, best_f1, best_f1_thresh
    when ``na_probs`` is given (like the official script, which needs the probabilities to sweep).
    """
    examples = _as_examples(examples_or_dataset)
    if not examples:
        raise ValueError("evaluate: no questions to score")
    missing = [ex.qas_id for ex in examples if ex.qas_id not in predictions]
    if missing:
        raise ValueError(f"evaluate: {len(missing)} questions have no prediction (first: {missing[:5]})")
    has_answer = {ex.qas_id: bool(ex.answers) for ex in examples}
    if na_probs is None:
        probs: Mapping[str, float] = dict.fromkeys(has_answer, 0.0)
    else:
        lacking = [q for q in has_answer if q not in na_probs]
        if lacking:
            raise ValueError(f"evaluate: {len(lacking)} questions have no na_prob (first: {lacking[:5]})")
        probs = {q: float(na_probs[q]) for q in has_answer}

    exact_raw, f1_raw = raw_scores(examples, predictions)
    exact = apply_no_answer_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1 = apply_no_answer_threshold(f1_raw, probs, has_answer, na_prob_thresh)

    out: dict[str, float] = {}
    out["exact"], out["f1"], out["total"] = _summary(exact, f1, list(has_answer))
    has_ids = [q for q, h in has_answer.items() if h]
    no_ids = [q for q, h in has_answer.items() if not h]
    if has_ids:
        out["HasAns_exact"], out["HasAns_f1"], out["HasAns_total"] = _summary(exact, f1, has_ids)
    if no_ids:
        out["NoAns_exact"], out["NoAns_f1"], out["NoAns_total"] = _summary(exact, f1, no_ids)
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(
            predictions, exact_raw, probs, has_answer
        )
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, probs, has_answer)
    return out


def per_question_f1(examples: Iterable[SquadExample], predictions: Mapping[str, str]) -> dict[str, float]:
    """Official F1 of each question's decided answer ("" = no answer), in [0, 1]."""
    return raw_scores(examples, predictions)[1]


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    groups: Sequence[Any] | np.ndarray | None = None,
    samples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """``(mean(a - b), low, high)``: the difference of two systems' per-question scores on the same
    questions, with a percentile bootstrap interval, the pair kept together. Scores in [0, 1] give a
    difference in F1 points when multiplied by 100.

    ``groups`` (each question's article, or paragraph) makes it a cluster bootstrap: whole groups are
    resampled, and the mean is over the questions they hold. Questions of one article share its text
    and its difficulty, so they are not independent draws: resampling questions alone gives intervals
    too narrow."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError("paired_bootstrap: two equally long, non-empty score lists are needed")
    rng = np.random.default_rng(seed)
    if groups is None:
        means = d[rng.integers(0, d.size, size=(samples, d.size))].mean(axis=1)
    else:
        labels = np.asarray(groups)
        if labels.shape != d.shape:
            raise ValueError("paired_bootstrap: one group per question is needed")
        _, which = np.unique(labels, return_inverse=True)
        sums, sizes = np.bincount(which, weights=d), np.bincount(which).astype(np.float64)
        picks = rng.integers(0, sums.size, size=(samples, sums.size))
        means = sums[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(d.mean()), float(low), float(high)


def per_group_means(values: Sequence[float] | np.ndarray, groups: Sequence[Any]) -> dict[str, float]:
    """Mean of ``values`` per group (e.g. the gain over answering none per article), by name."""
    v, labels = np.asarray(values, dtype=np.float64), np.asarray(groups)
    return {str(g): float(v[labels == g].mean()) for g in sorted(set(labels.tolist()), key=str)}
