"""Honest held-out comparison of answerability rules (used by `train.experiments.study` and `train.experiments.ablation`).

One QA model, three sets of articles that share nothing: the fine-tuning articles (the question
verifier is fitted there), the calibration articles (the combining model, calibration, threshold and
rule are fitted there, by cross-fitting) and the evaluated articles (only scored). Every rule is
fitted on the first two and applied, unchanged, to the third, next to answering none:

- answering none;
- today's rule: sigmoid(cls_logit) against the threshold with the best F1 on the calibration articles;
- the model's scores (cls, null span, span confidence), calibrated;
- the word-overlap verifier + span: the question verifier alone, calibrated, deciding on the best span;
- the verifier combined with the model's scores;
- the final rule: the model's stored answerability (fine-tuning's ``--answerability auto`` keeps the
  better of the two verifier rows by its own cross-validation on the calibration articles).

Each row has F1 with the difference from answering none and its paired bootstrap 95% interval over
questions, and the ROC AUC of its P(answerable); a second table gives the ROC AUC of each raw score
(cls alone, null span, verifier alone, combined); a reliability plot shows calibration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qa_core.squad import Answerability, Prediction, SquadExample
from qa_core.squad.answerability import from_metadata
from train.answerability.fit import (
    FEATURE_SETS,
    FitOptions,
    best_threshold,
    build_table,
    fit_answerability,
    fit_auto,
    fit_question_verifier,
    roc_auc,
)
from train.evaluation.predict import predict_ensemble, redecide
from train.model import checkpoint
from train.squad import paired_bootstrap, per_group_means, per_question_f1


@dataclass
class HeldOut:
    """Questions and the QA model's predictions for them (decided by the model's own cls threshold)."""

    examples: list[SquadExample]
    predictions: dict[str, Prediction]


def predict_file(
    model_dir: str | Path, examples: Sequence[SquadExample], batch_size: int = 32, progress: bool = False
) -> HeldOut:
    return predict_files([model_dir], examples, batch_size, progress)


def predict_files(
    model_dirs: Sequence[str | Path],
    examples: Sequence[SquadExample],
    batch_size: int = 32,
    progress: bool = False,
) -> HeldOut:
    """One checkpoint's predictions, or an ensemble's (several seeds of one recipe, logits averaged)."""
    members = [checkpoint.load(d) for d in model_dirs]
    return HeldOut(list(examples), predict_ensemble(members, examples, batch_size, progress))


@dataclass
class Row:
    """One rule scored on the evaluated questions."""

    name: str
    f1: float
    has_ans_f1: float | None
    no_ans_f1: float | None
    answered: int
    diff: float  # F1 points above answering none
    low: float  # its 95% interval, articles resampled (the unit that moves together)
    high: float
    roc_auc: float | None
    cv: dict[str, Any] | None = None  # what the fitting's own cross-validation expected
    paragraph_low: float = 0.0  # the same interval with paragraphs resampled
    paragraph_high: float = 0.0
    per_article: dict[str, float] = field(default_factory=dict)  # F1 points above none, per article

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def score_rule(name: str, rule: Answerability | None, held: HeldOut, cv: dict | None = None) -> Row:
    """F1 of ``rule`` (None: answer nothing) on the held-out questions, against answering none."""
    qids = [ex.qas_id for ex in held.examples]
    none = per_question_f1(held.examples, dict.fromkeys(qids, ""))
    if rule is None:
        decided = dict.fromkeys(qids, "")
        probs = None
    else:
        preds = redecide(held.examples, held.predictions, rule)
        decided = {q: p.text for q, p in preds.items()}
        probs = np.array([preds[q].answerable_prob for q in qids])
    got = per_question_f1(held.examples, decided)
    a, b = np.array([got[q] for q in qids]), np.array([none[q] for q in qids])
    articles = [ex.title for ex in held.examples]
    paragraphs = [f"{ex.title}\n{ex.context}" for ex in held.examples]
    diff, low, high = paired_bootstrap(a, b, groups=articles)
    _, paragraph_low, paragraph_high = paired_bootstrap(a, b, groups=paragraphs)
    has = np.array([bool(ex.answers) for ex in held.examples])
    return Row(
        name=name,
        f1=100 * float(a.mean()),
        has_ans_f1=100 * float(a[has].mean()) if has.any() else None,
        no_ans_f1=100 * float(a[~has].mean()) if (~has).any() else None,
        answered=sum(bool(t) for t in decided.values()),
        diff=100 * diff,
        low=100 * low,
        high=100 * high,
        roc_auc=roc_auc(probs, has) if probs is not None else None,
        cv=cv,
        paragraph_low=100 * paragraph_low,
        paragraph_high=100 * paragraph_high,
        per_article={k: 100 * v for k, v in per_group_means(a - b, articles).items()},
    )


def span_f1(held: HeldOut) -> float:
    """F1 of the best span on the answerable questions, the no-answer decision switched off."""
    answerable = [ex for ex in held.examples if ex.answers]
    best = {ex.qas_id: held.predictions[ex.qas_id].best_span_text for ex in answerable}
    scores = per_question_f1(answerable, best)
    return 100 * float(np.mean(list(scores.values()))) if scores else 0.0


@dataclass
class Comparison:
    rows: list[Row]
    score_aucs: dict[str, float | None]  # raw scores on the evaluated questions
    span_f1: float
    reliability: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (P(answerable), answerable)


def compare_rules(
    stored: Mapping[str, Any],
    fit_examples: Sequence[SquadExample],
    calibration: HeldOut,
    evaluated: HeldOut,
    calibration_method: str = "platt",
) -> Comparison:
    """Every rule fitted on the fine-tuning and calibration articles, scored on the evaluated ones."""
    final = from_metadata(stored)
    verifier = final.verifier
    if verifier is None:
        verifier, _ = fit_question_verifier(fit_examples)
    cal_t = build_table(calibration.examples, calibration.predictions, ("cls_logit",))
    cls_probs = np.array([calibration.predictions[q].answerable_prob for q in cal_t.qids])
    rules: list[tuple[str, Answerability | None, dict | None]] = [("answering none", None, None)]
    rules.append(("cls threshold (before)", Answerability.cls_only(best_threshold(cls_probs, cal_t)), None))

    def fitted(features: str) -> Answerability:
        return fit_answerability(
            calibration.examples,
            calibration.predictions,
            FitOptions(FEATURE_SETS[features], calibration_method),
            verifier,
        )

    for name, features in (
        ("model scores", "model-scores"),
        ("word-overlap verifier + span", "verifier-only"),
        ("verifier + model scores", "verifier"),
    ):
        a = fitted(features)
        rules.append((name, a, a.report.get("cv")))
    if (
        final.report.get("kind") == "cls"
    ):  # the model stores no fitted rule: fit one here, as fine-tuning would
        final = fit_auto(calibration.examples, calibration.predictions, verifier, calibration_method)
    chosen = final.report.get("feature_set") or "+".join(final.model.features)
    rules.append((f"final ({chosen})", final, final.report.get("cv")))
    rows = [score_rule(name, rule, evaluated, cv) for name, rule, cv in rules]
    names = ("cls_logit", "null_margin", "verifier_logit")
    t = build_table(evaluated.examples, evaluated.predictions, names, verifier)
    has_null = any(p.null_log_prob is not None for p in evaluated.predictions.values())
    final_preds = redecide(evaluated.examples, evaluated.predictions, final)
    final_p = np.array([final_preds[q].answerable_prob for q in t.qids])
    cls_p = np.array([evaluated.predictions[q].answerable_prob for q in t.qids])
    aucs = {
        "cls alone": roc_auc(-t.columns(["cls_logit"])[:, 0], t.answerable),
        "null span": roc_auc(-t.columns(["null_margin"])[:, 0], t.answerable) if has_null else None,
        "verifier alone": roc_auc(t.columns(["verifier_logit"])[:, 0], t.answerable),
        "combined (final)": roc_auc(final_p, t.answerable),
    }
    reliability = {"final": (final_p, t.answerable), "sigmoid(cls)": (cls_p, t.answerable)}
    return Comparison(rows, aucs, span_f1(evaluated), reliability)


INDICATIVE_BELOW = 8  # scored articles: with fewer, an interval over articles is only indicative


def rows_table(comparisons: Sequence[tuple[str, Comparison]]) -> list[str]:
    """Markdown: one line per (run, rule), the interval by article and by paragraph."""
    head = (
        "| run | rule | F1 | HasAns F1 | NoAns F1 | answered | F1 - none | 95% CI, articles resampled "
        "| 95% CI, paragraphs resampled | ROC AUC | CV F1 (calibration) |"
    )
    lines = [head, "|" + " --- |" * 11]
    for run, c in comparisons:
        for r in c.rows:
            flat = r.roc_auc is None and r.answered == 0
            diff = "–" if flat else f"{r.diff:+.2f}"
            by_article = "–" if flat else f"[{r.low:+.2f}, {r.high:+.2f}]"
            by_paragraph = "–" if flat else f"[{r.paragraph_low:+.2f}, {r.paragraph_high:+.2f}]"
            cv = "–" if not r.cv else f"{r.cv['f1']:.2f} vs {r.cv['no_answer_f1']:.2f}"
            lines.append(
                f"| {run} | {r.name} | {r.f1:.2f} | {_f(r.has_ans_f1)} | {_f(r.no_ans_f1)} | {r.answered} | "
                f"{diff} | {by_article} | {by_paragraph} | {_f(r.roc_auc, 3)} | {cv} |"
            )
    return lines


def per_article_table(comparisons: Sequence[tuple[str, Comparison]]) -> list[str]:
    """Markdown: each rule's gain over answering none on each scored article (F1 points)."""
    titles = sorted({t for _, c in comparisons for r in c.rows for t in r.per_article})
    lines = ["| run | rule | " + " | ".join(titles) + " |", "|" + " --- |" * (len(titles) + 2)]
    for run, c in comparisons:
        for r in c.rows:
            if r.per_article:
                cells = " | ".join(f"{r.per_article.get(t, float('nan')):+.2f}" for t in titles)
                lines.append(f"| {run} | {r.name} | {cells} |")
    return lines


def interval_note(articles: int) -> str:
    """What the intervals can claim with this many scored articles."""
    if articles < INDICATIVE_BELOW:
        return (
            f"Only {articles} articles were scored: an interval that resamples so few articles is indicative, "
            "not a guarantee (the paragraph interval is narrower and optimistic: paragraphs of one article "
            "are not independent)."
        )
    return f"{articles} articles were scored; intervals resample whole articles (2,000 resamples)."


def aucs_table(comparisons: Sequence[tuple[str, Comparison]]) -> list[str]:
    names = list(comparisons[0][1].score_aucs) if comparisons else []
    lines = ["| run | " + " | ".join(names) + " | span F1 |", "|" + " --- |" * (len(names) + 2)]
    for run, c in comparisons:
        lines.append(
            f"| {run} | " + " | ".join(_f(c.score_aucs[n], 3) for n in names) + f" | {c.span_f1:.2f} |"
        )
    return lines


def plot_reliability(path: Path, comparisons: Sequence[tuple[str, Comparison]], bins: int = 10) -> None:
    """Predicted P(answerable) against the observed share of answerable questions, per bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, max(1, len(comparisons)), figsize=(5 * max(1, len(comparisons)), 4.5), squeeze=False
    )
    for ax, (run, c) in zip(axes[0], comparisons, strict=False):
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
        for name, (p, y) in c.reliability.items():
            edges = np.linspace(0, 1, bins + 1)
            which = np.clip(np.digitize(p, edges) - 1, 0, bins - 1)
            xs, ys, ns = [], [], []
            for b in range(bins):
                m = which == b
                if m.sum():
                    xs.append(p[m].mean())
                    ys.append(y[m].mean())
                    ns.append(int(m.sum()))
            ax.plot(xs, ys, marker="o", label=name)
            for x_, y_, n in zip(xs, ys, ns, strict=True):
                ax.annotate(str(n), (x_, y_), fontsize=7, textcoords="offset points", xytext=(3, 3))
        ax.set_title(run, fontsize=9)
        ax.set_xlabel("predicted P(answerable)")
        ax.set_ylabel("answerable share (held-out)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
