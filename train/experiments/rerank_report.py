"""Span re-ranker on vs off, and the stored decision rule, on articles nothing was fitted or chosen on.

The checkpoint's metadata holds the rule and its re-ranker (fitted by `train.finetune` or
`train.calibrate` on other articles). The reader runs once over ``--data``; the same spans are then
scored three ways, paired by question: the reader's best span, that span snapped to whole words, and
the re-ranked best span. Differences are summarised over articles (cluster bootstrap, t interval, exact
sign test: :mod:`train.experiments.article_stats`). The re-ranker's own cross-fitted report (each
calibration article ranked by a model fitted on the others) is summarised the same way and pooled
with the scored articles: every article there was ranked by a model that never saw it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qa_core.squad import Prediction, SquadExample, read_squad
from qa_core.squad.answerability import NONE_RULE, from_metadata
from qa_core.squad.rerank import snap_to_words
from train.answerability.estimators import roc_auc
from train.common.cli import Parser
from train.evaluation.predict import predict_checkpoint, redecide
from train.experiments.article_stats import column, compare_by_article, describe, summary
from train.model import checkpoint
from train.squad.metrics import best_exact_f1

ORACLE_DEPTHS = (1, 5, 10, 20)


def build_parser() -> Parser:
    p = Parser(prog="python -m train.rerank_report", description=__doc__.splitlines()[0])
    p.add_argument(
        "--checkpoint", required=True, help="fine-tuned QA checkpoint whose rule holds a re-ranker"
    )
    p.add_argument("--data", required=True, help="labelled SQuAD 2.0 file of articles nothing was fitted on")
    p.add_argument(
        "--out", required=True, help="directory for rerank.json, decisions.json, RESULTS.md, a plot"
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--no-progress", action="store_true")
    return p


def question_rows(
    examples: Sequence[SquadExample], reader: Mapping[str, Prediction], decided: Mapping[str, Prediction]
) -> list[dict[str, Any]]:
    """Per question: the three spans' F1 (answerable questions), the decision and its F1."""
    rows = []
    for ex in examples:
        p, d = reader[ex.qas_id], decided[ex.qas_id]
        decided_exact, decided_f1 = best_exact_f1(ex.answer_texts, d.text)
        row: dict[str, Any] = {
            "id": ex.qas_id,
            "article": ex.title,
            "answerable": bool(ex.answers),
            "answered": d.text,
            "answerable_prob": d.answerable_prob,
            "decided_f1": decided_f1,
            "decided_exact": decided_exact,
            "none_f1": best_exact_f1(ex.answer_texts, "")[1],
        }
        if ex.answers and p.n_best:
            best = p.n_best[0]
            a, b = snap_to_words(ex.context, best.start, best.end)
            reranked_exact, reranked_f1 = best_exact_f1(ex.answer_texts, d.best_span_text)
            row |= {
                "reader_span": best.text,
                "reranked_span": d.best_span_text,
                "reader_f1": best_exact_f1(ex.answer_texts, best.text)[1],
                "snapped_f1": best_exact_f1(ex.answer_texts, ex.context[a:b])[1],
                "reranked_f1": reranked_f1,
                "reranked_exact": reranked_exact,
            }
            for k in ORACLE_DEPTHS:
                row[f"top{k}_f1"] = max(best_exact_f1(ex.answer_texts, e.text)[1] for e in p.n_best[:k])
        rows.append(row)
    return rows


def build_report(rows: Sequence[Mapping[str, Any]], cross_fitted: Mapping[str, Any] | None) -> dict[str, Any]:
    spans = [r for r in rows if "reader_f1" in r]
    articles = [r["article"] for r in spans]
    report: dict[str, Any] = {
        "articles": sorted({r["article"] for r in rows}),
        "questions": len(rows),
        "answerable": len(spans),
        "span_f1": {
            k: 100 * float(column(spans, f"{k}_f1").mean()) for k in ("reader", "snapped", "reranked")
        },
        "reranked_span_exact": 100 * float(column(spans, "reranked_exact").mean()),
        "oracle_span_f1": {f"top{k}": 100 * float(column(spans, f"top{k}_f1").mean()) for k in ORACLE_DEPTHS},
        "reranked_vs_reader": compare_by_article(
            column(spans, "reranked_f1"), column(spans, "reader_f1"), articles
        ),
        "snapped_vs_reader": compare_by_article(
            column(spans, "snapped_f1"), column(spans, "reader_f1"), articles
        ),
        "reranked_vs_snapped": compare_by_article(
            column(spans, "reranked_f1"), column(spans, "snapped_f1"), articles
        ),
    }
    all_articles = [r["article"] for r in rows]
    report["decision"] = {
        "answered": sum(bool(r["answered"]) for r in rows),
        "f1": 100 * float(column(rows, "decided_f1").mean()),
        "exact": 100 * float(column(rows, "decided_exact").mean()),
        "none_f1": 100 * float(column(rows, "none_f1").mean()),
        "vs_none": compare_by_article(column(rows, "decided_f1"), column(rows, "none_f1"), all_articles),
        "roc_auc": roc_auc(column(rows, "answerable_prob"), np.array([r["answerable"] for r in rows])),
    }
    if cross_fitted:
        cal = {t: v["reranked"] - v["reader"] for t, v in cross_fitted.items()}
        cal_sizes = {t: int(v["questions"]) for t, v in cross_fitted.items()}
        report["calibration_cross_fitted"] = summary(cal, cal_sizes)
        held = report["reranked_vs_reader"]
        pooled = cal | held["per_article"]
        held_sizes = {t: int(n) for t, n in Counter(articles).items()}
        report["pooled_out_of_fold"] = summary(pooled, cal_sizes | held_sizes)
        # what the pool mixes: the calibration articles each ranked by a re-ranker fitted on the other
        # calibration articles, the held-out ones by the shipped re-ranker (fitted on all of them)
        report["pooled_out_of_fold"]["rankers"] = {
            "leave_one_article_out": sorted(cal),
            "shipped": sorted(held["per_article"]),
        }
    return report


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def results_markdown(report: Mapping[str, Any], rule: str) -> str:
    s = report["span_f1"]
    o = report["oracle_span_f1"]
    d = report["decision"]
    lines = [
        f"# Span re-ranker on {_count(len(report['articles']), 'article')}: {', '.join(report['articles'])}",
        "",
        f"{report['questions']} questions, {report['answerable']} answerable. Span F1 is on the answerable "
        "questions with the decision switched off; differences are in F1 points, per question, summarised "
        "over articles.",
        "",
        "| span | F1 |",
        "| --- | --- |",
        f"| the reader's best span | {s['reader']:.2f} |",
        f"| snapped to whole words | {s['snapped']:.2f} |",
        f"| re-ranked (snapped, top spans reordered) | {s['reranked']:.2f} |",
        f"| best of the reader's top 5 / 10 / 20 (an oracle) | {o['top5']:.2f} / {o['top10']:.2f} / {o['top20']:.2f} |",
        "",
        f"- re-ranked vs the reader: {describe(report['reranked_vs_reader'])}",
        f"- snapping alone: {describe(report['snapped_vs_reader'])}",
        f"- reordering alone (re-ranked vs snapped): {describe(report['reranked_vs_snapped'])}",
    ]
    if "calibration_cross_fitted" in report:
        c, p = report["calibration_cross_fitted"], report["pooled_out_of_fold"]
        lines += [
            f"- on the calibration articles, each ranked by a model fitted on the others: {describe(c)}",
            f"- pooled, every article ranked by a model that never saw it (the calibration articles by "
            f"leave-one-article-out re-rankers, the held-out ones by the shipped one): {describe(p)}",
        ]
    auc = "–" if d["roc_auc"] is None else f"{d['roc_auc']:.3f}"
    lines += [
        "",
        f"Decision rule stored with the model: `{rule}`. It answered {d['answered']} of {report['questions']} "
        f"questions: F1 {d['f1']:.2f} against {d['none_f1']:.2f} for answering none; "
        f"{describe(d['vs_none'])}. ROC AUC of P(answerable): {auc}.",
    ]
    if rule == NONE_RULE:
        lines.append("The rule answers nothing: its F1 is answering none's by construction.")
    return "\n".join(lines) + "\n"


def plot_articles(path: Path, report: Mapping[str, Any]) -> None:
    """Per-article span F1 gain of the re-ranker (scored articles and cross-fitted calibration ones)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = report["reranked_vs_reader"]["per_article"]
    cal = report.get("calibration_cross_fitted", {}).get("per_article", {})
    names = list(scored) + list(cal)
    values = [scored[n] for n in scored] + [cal[n] for n in cal]
    colors = ["tab:blue"] * len(scored) + ["tab:grey"] * len(cal)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(names)), 4))
    ax.bar(range(len(names)), values, color=colors)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("span F1: re-ranked minus reader (points)")
    ax.set_title("blue: scored articles; grey: calibration articles, cross-fitted", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    loaded = checkpoint.load(args.checkpoint)
    rule = from_metadata(loaded.metadata)
    if rule.reranker is None:
        raise ValueError(
            f"{args.checkpoint}: its metadata holds no span re-ranker (fit one: python -m train.calibrate)"
        )
    examples = read_squad(args.data)
    if not any(ex.answers for ex in examples):
        raise ValueError(f"{args.data}: no answerable question to score spans on")
    reader = predict_checkpoint(loaded, examples, args.batch_size, progress=not args.no_progress)
    decided = redecide(examples, reader, rule)
    rows = question_rows(examples, reader, decided)
    report = build_report(rows, (rule.reranker.report or {}).get("cross_fitted"))
    report["checkpoint"], report["data"], report["rule"] = str(args.checkpoint), str(args.data), rule.rule
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rerank.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "decisions.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "RESULTS.md").write_text(results_markdown(report, rule.rule))
    plot_articles(out / "rerank.png", report)
    print((out / "RESULTS.md").read_text())
    return 0
