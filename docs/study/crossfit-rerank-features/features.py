"""Would the span re-ranker choose better spans with evidence of where the question's words sit around a
candidate, not only in its sentence? Measured on a finished cross-fit's out-of-fold spans, nested by fold
(each fold's questions re-ranked by a model fitted on the other folds', as train.crossfit does).

Candidate features tried beside the shipped eleven (``rerank.CANDIDATE_FEATURES``):

- ``local_overlap``: the rarity-weighted share of the question's content stems found within 10 words
  either side of the span (sentence bounds ignored: the question's words may sit in the clause before);
- ``nearest_any``: 1 / (1 + words to the nearest question stem anywhere in the context, outside the span);
- ``neighbour_in_question``: the word just before or just after the span is one of the question's;
- the reader's own evidence split: ``start_gap`` and ``end_gap`` (each end's log-probability minus the
  reader's best span's), ``tokens`` (log of the span's length in tokens), ``inside_best`` and
  ``holds_best`` (the candidate lies inside, or holds, the reader's best span).

A second argument picks new columns by position (``3,4,5,6,7``: the reader's evidence alone).

Prints, per re-ranker form (linear, trees), the span F1 of the reader's best and of the re-ranked best
on every article's answerable questions, with and without the new features, and the paired difference
with articles as the unit (bootstrap, t interval, sign test).

    PYTHONPATH=. python docs/study/crossfit-rerank-features/features.py runs/crossfit-4fold-1600 [COLUMNS]
"""

from __future__ import annotations

import bisect
import sys
from pathlib import Path

import numpy as np

from qa_core.squad.answerability_features import match_question
from qa_core.squad.rerank import CANDIDATE_FEATURES
from qa_core.text import STOPWORDS, WORD, stem
from train.answerability.rerank_fit import CandidateTable, _chosen_f1, _LinearFit, _TreesFit
from train.experiments.article_stats import compare_by_article, describe
from train.experiments.pipeline_crossfit import load_outputs

WINDOW = 10
NEW = (
    "local_overlap",
    "nearest_any",
    "neighbour_in_question",
    "start_gap",
    "end_gap",
    "tokens",
    "inside_best",
    "holds_best",
)


class ContextWords:
    """The context's words once: character starts and ends, and stems (stopwords as None)."""

    def __init__(self, context: str) -> None:
        found = list(WORD.finditer(context.replace("\u2019", "'")))
        self.starts = [m.start() for m in found]
        self.ends = [m.end() for m in found]
        lowered = [m.group().lower() for m in found]
        self.stems = [None if w in STOPWORDS else stem(w) for w in lowered]


def extra_features(words: ContextWords, weights: dict[str, float], start: int, end: int) -> list[float]:
    first = bisect.bisect_left(words.ends, start + 1)  # the first word ending inside or after the span
    last = bisect.bisect_left(words.starts, end)  # words from here on start at or after its end
    total = sum(weights.values()) or 1.0
    around = set(words.stems[max(0, first - WINDOW) : first]) | set(words.stems[last : last + WINDOW])
    local = sum(w for s, w in weights.items() if s in around) / total
    hits = [i for i, s in enumerate(words.stems) if s in weights and not first <= i < last]
    if hits:
        at = bisect.bisect_left(hits, first)
        gaps = ([first - hits[at - 1] - 1] if at else []) + ([hits[at] - last] if at < len(hits) else [])
        nearest = 1.0 / (1.0 + min(gaps))
    else:
        nearest = 0.0
    neighbours = {words.stems[i] for i in (first - 1, last) if 0 <= i < len(words.stems)}
    return [local, nearest, float(bool(neighbours & weights.keys()))]


def table_with_extras(examples, predictions) -> tuple[CandidateTable, np.ndarray]:
    t = CandidateTable(examples, predictions)
    from qa_core.squad.answerability_features import ContextIndex
    from qa_core.squad.rerank import snapped

    cache: dict[str, tuple[ContextWords, ContextIndex]] = {}
    rows = []
    for ex in t.questions:
        words, index = cache.get(ex.context) or cache.setdefault(
            ex.context, (ContextWords(ex.context), ContextIndex(ex.context))
        )
        weights = match_question(ex.question, index).weights
        head = snapped(ex.context, predictions[ex.qas_id].n_best[:10])
        top = head[0]
        for e in head:
            rows.append(
                extra_features(words, weights, e.start, e.end)
                + [
                    max(e.start_log_prob - top.start_log_prob, -30.0),
                    max(e.end_log_prob - top.end_log_prob, -30.0),
                    float(np.log1p(e.end_token - e.start_token + 1)),
                    float(top.start <= e.start and e.end <= top.end and e is not top),
                    float(e.start <= top.start and top.end <= e.end and e is not top),
                ]
            )
    extra = np.array(rows, dtype=np.float64)
    assert len(extra) == len(t.f1), "one row per candidate, in the table's order"
    return t, extra


def chosen(t: CandidateTable, x: np.ndarray, fold_of: dict[str, int], fitter) -> np.ndarray:
    """Each question's re-ranked span F1 (in the table's question order), each fold's candidates scored
    by a model fitted on the other folds'."""
    scores = np.full(len(t.f1), -np.inf)
    folds = np.array([fold_of[a] for a in t.articles])
    for f in sorted(set(folds.tolist())):
        held, train = np.flatnonzero(folds == f), np.flatnonzero(folds != f)
        scores[held] = fitter(x[train], t.f1[train]).scores(x[held])
    picked = _chosen_f1(t, scores, np.arange(len(t.f1)))
    return np.array([picked[q] for q in range(len(t))])


def main() -> int:
    run = Path(sys.argv[1])
    examples, readers, fold_of = load_outputs(run)
    every = [ex for f in sorted(examples) for ex in examples[f]]
    predictions = {q: p for f in readers for q, p in readers[f].items()}
    t, extra = table_with_extras(every, predictions)
    print(f"{run}: {len(t)} answerable questions, {len(t.f1)} candidates; new: {', '.join(NEW)}\n")
    with_extra = np.hstack([t.x, extra])
    only = [int(i) for i in sys.argv[2].split(",")] if len(sys.argv) > 2 else None
    if only is not None:  # a subset of the new columns, by position in NEW
        with_extra = np.hstack([t.x, extra[:, only]])
        print("new columns used: " + ", ".join(NEW[i] for i in only))
    titles = [ex.title for ex in t.questions]
    print(f"reader's best span: F1 {100 * t.raw_f1.mean():.2f}")
    for name, fitter in (("linear", _LinearFit), ("trees", _TreesFit)):
        base, new = chosen(t, t.x, fold_of, fitter), chosen(t, with_extra, fold_of, fitter)
        print(
            f"{name}: re-ranked span F1 {100 * base.mean():.2f} -> {100 * new.mean():.2f} with "
            f"{len(CANDIDATE_FEATURES)} + {with_extra.shape[1] - len(CANDIDATE_FEATURES)} features; {describe(compare_by_article(new, base, titles))}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
