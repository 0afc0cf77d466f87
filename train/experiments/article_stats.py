"""What a difference between two systems, measured on a few articles, can carry.

Questions of one article share its text and its difficulty, so the article is the unit that is
sampled. Three views of the same per-article differences, reported side by side:

- the cluster bootstrap (whole articles resampled, question-weighted mean), which with few articles
  has few distinct resamples (4 articles: 35) and is too narrow;
- Student's t interval over the articles' mean differences (articles - 1 degrees of freedom);
- the exact sign test over articles (two-sided), whose smallest possible p-value is 2 / 2^n: 0.125
  with 4 articles, so 4 articles can never make it significant at 0.05.

A difference is called credible only when all three agree (both intervals above or below 0 and the
sign test's p below 0.05).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from train.squad import paired_bootstrap, per_group_means

LEVEL = 0.95


def column(rows: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    """One per-question field of report rows as floats (the reports' per-question tables)."""
    return np.array([r[key] for r in rows], dtype=np.float64)


def sign_test(diffs: Sequence[float]) -> float:
    """Exact two-sided sign test p-value of the differences (zeros dropped; 1.0 when none is left)."""
    d = [x for x in diffs if x != 0.0]
    n = len(d)
    if n == 0:
        return 1.0
    k = min(sum(x > 0 for x in d), sum(x < 0 for x in d))
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def smallest_sign_test_p(articles: int) -> float:
    """The smallest p-value the two-sided sign test can give with this many articles."""
    return min(1.0, 2 / 2**articles) if articles else 1.0


def t_interval(diffs: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the articles' differences (unweighted), Student's t; with fewer than
    two articles the interval is unbounded."""
    from scipy.stats import t as student

    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return (float(d.mean()) if d.size else 0.0), -math.inf, math.inf
    half = float(student.ppf(0.5 + level / 2, d.size - 1)) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return float(d.mean()), float(d.mean()) - half, float(d.mean()) + half


def compare_by_article(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    articles: Sequence[str],
    *,
    scale: float = 100.0,
) -> dict[str, Any]:
    """``a - b`` per question (same questions, in [0, 1]) summarised over articles, in points."""
    av, bv = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    groups = np.asarray(articles)
    per_article = {k: scale * v for k, v in per_group_means(av - bv, list(articles)).items()}
    sizes = {str(k): int(n) for k, n in zip(*np.unique(groups, return_counts=True), strict=True)}
    diff, low, high = paired_bootstrap(av, bv, groups=groups)
    return summary(per_article, sizes, (scale * diff, scale * low, scale * high))


def cluster_bootstrap(
    per_article: Mapping[str, float],
    sizes: Mapping[str, int],
    samples: int = 2000,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the question-weighted mean of per-article differences and its percentile
    interval with whole articles resampled, from each article's mean and question count alone (what a
    resampling of the articles' questions gives: ``train.squad.paired_bootstrap`` with groups)."""
    names = sorted(per_article, key=str)
    n = np.array([float(sizes[k]) for k in names])
    sums = np.array([per_article[k] for k in names]) * n
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(names), size=(samples, len(names)))
    means = sums[picks].sum(axis=1) / n[picks].sum(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(sums.sum() / n.sum()), float(low), float(high)


def summary(
    per_article: Mapping[str, float],
    sizes: Mapping[str, int],
    bootstrap: tuple[float, float, float] | None = None,
) -> dict[str, Any]:
    """The three views of per-article differences (points; ``sizes``: each article's questions) and
    whether they agree. ``bootstrap``: the cluster bootstrap's ``(mean, low, high)`` when the caller has
    it from the questions; otherwise it is computed from the articles' means and sizes. All three views
    are always computed: none is dropped."""
    if set(sizes) != set(per_article):
        raise ValueError("summary: every article needs its number of questions")
    diffs = list(per_article.values())
    t_mean, t_low, t_high = t_interval(diffs)
    p = sign_test(diffs)
    mean, b_low, b_high = bootstrap if bootstrap is not None else cluster_bootstrap(per_article, sizes)
    agree_up = t_low > 0 and p < 0.05 and b_low > 0
    agree_down = t_high < 0 and p < 0.05 and b_high < 0
    return {
        "articles": len(diffs),
        "questions": int(sum(sizes.values())),
        "per_article": dict(per_article),
        "better": sum(d > 0 for d in diffs),
        "worse": sum(d < 0 for d in diffs),
        "mean": mean,
        "bootstrap": [b_low, b_high],
        "article_mean": t_mean,
        "t_interval": [t_low, t_high],
        "sign_test_p": p,
        "smallest_possible_p": smallest_sign_test_p(len(diffs)),
        "credible": "better" if agree_up else "worse" if agree_down else "no",
    }


def describe(s: Mapping[str, Any]) -> str:
    """One line: mean, both intervals, the sign test and what they carry together."""
    lo, hi = s["bootstrap"]
    parts = [f"{s['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}] (articles resampled)"]
    lo, hi = s["t_interval"]
    parts.append(f"article mean {s['article_mean']:+.2f}, t interval [{lo:+.2f}, {hi:+.2f}]")
    parts.append(
        f"better on {s['better']} of {s['articles']} articles, sign test p = {s['sign_test_p']:.3g} "
        f"(smallest possible {s['smallest_possible_p']:.3g})"
    )
    verdict = {"better": "credibly better", "worse": "credibly worse", "no": "not credible either way"}
    return "; ".join(parts) + f": {verdict[s['credible']]}"
