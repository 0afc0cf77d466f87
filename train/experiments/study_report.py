"""What `train.experiments.study` writes once its stages have run: RESULTS.md (the runs' held-out scores
next to the no-answer baseline, then the answerability rules side by side), comparison.json and the
study plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from train.experiments.heldout import aucs_table, interval_note, per_article_table, rows_table
from train.squad import evaluate


def comparison_section(comparisons, honest: bool, scored_articles: int) -> list[str]:
    where = (
        "on the calibration articles (held out of fine-tuning), the question verifier on the fine-tuning articles"
        if honest
        else "on the evaluated questions themselves (--calibration-articles 0: optimistic)"
    )
    return [
        "",
        "## Answerability rules on the evaluated questions",
        "",
        f"Every rule was fitted {where}, then applied unchanged to the evaluated questions. F1 - none: the "
        "difference from answering none, with paired bootstrap 95% intervals resampling whole articles (the "
        "unit whose questions move together) and, beside it, whole paragraphs. CV F1: what the rule's own "
        "cross-validation over calibration articles expected (against answering none there).",
        "",
        interval_note(scored_articles),
        "",
        *rows_table(comparisons),
        "",
        "Gain over answering none on each evaluated article (F1 points):",
        "",
        *per_article_table(comparisons),
        "",
        "ROC AUC of each score for answerable vs unanswerable evaluated questions (cls and null span: "
        "higher means unanswerable, so negated), and the span F1 (best span, decision switched off):",
        "",
        *aucs_table(comparisons),
        "",
        "![reliability](reliability.png)",
        "",
    ]


def comparison_json(comparisons) -> dict:
    return {
        run: {"rows": [r.as_dict() for r in c.rows], "score_aucs": c.score_aucs, "span_f1": c.span_f1}
        for run, c in comparisons
    }


def no_answer_baseline(examples) -> dict:
    return evaluate(examples, {ex.qas_id: "" for ex in examples})


def span_quality(examples, nbest: dict) -> dict:
    """EM/F1 of the best span on the answerable questions with the no-answer decision switched off.

    A small model's answerability classifier often wins the threshold search by saying "no answer"
    everywhere; this column shows whether its span extraction learned anything all the same.
    """
    answerable = [ex for ex in examples if ex.answers]
    if not answerable:
        return {}
    preds = {ex.qas_id: (nbest.get(ex.qas_id) or [{"text": ""}])[0]["text"] for ex in answerable}
    m = evaluate(answerable, preds)
    return {"span_exact": m["exact"], "span_f1": m["f1"]}


KEYS = ("exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "span_exact", "span_f1")


def pretraining_line(args, pretrained: bool) -> str:
    """What the report says of pretraining: its size only when a run started from it."""
    if not pretrained:
        return "Pretraining: none (every run starts from random weights)"
    return f"Pretraining: {args.pretrain_steps} steps x {args.pretrain_batch} x {args.seq_len} tokens"


def write_report(
    out: Path, args, rows, baseline, seconds, n_fit: int, held_examples, honest: bool, pretrained: bool
) -> None:
    lines = [
        "| run | " + " | ".join(KEYS) + " |",
        "| --- |" + " --- |" * len(KEYS),
        "| no-answer baseline | " + " | ".join(_fmt(baseline.get(k)) for k in KEYS) + " |",
    ]
    for name, m in rows:
        lines.append(f"| {args.config}, {name} | " + " | ".join(_fmt(m.get(k)) for k in KEYS) + " |")
    n_ans = sum(bool(ex.answers) for ex in held_examples)
    where = (
        "articles held out of fine-tuning (calibration.json) and the fine-tuning articles (question verifier)"
        if honest
        else "the evaluated questions themselves (optimistic)"
    )
    text = [
        f"# End-to-end study ({args.config} preset, {args.head} head)",
        "",
        f"Fine-tuned on {n_fit} questions; evaluated on {len(held_examples)} questions never trained on "
        f"({n_ans} answerable). Answerability fitted on {where}. {pretraining_line(args, pretrained)}; "
        f"synthetic stage: {args.synth_steps} steps; "
        f"fine-tuning: {args.finetune_steps} steps x {args.finetune_batch} windows of {args.max_seq_len}.",
        "",
        *lines,
        "",
        "exact / f1 / HasAns_f1 / NoAns_f1: decided by the model's stored answerability rule. best_f1: with the threshold searched "
        "on the evaluated questions (an upper bound, as the original XLNet reports). span_exact / span_f1: "
        "the best span on the answerable questions with the no-answer decision switched off.",
        "",
        "Minutes per stage (this call; reused stages are not counted): "
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in seconds.items()),
        "",
    ]
    (out / "RESULTS.md").write_text("\n".join(text))


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the `window - 1` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_study(path: Path, rows, baseline: dict, curves: dict[str, list[tuple[int, float]]]) -> None:
    """Held-out scores per run (left) and the fine-tuning loss curves, smoothed (right)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (bars, lines) = plt.subplots(1, 2, figsize=(13, 4.5))
        names = ["no-answer"] + [n for n, _ in rows]
        series = {"F1": "f1", "best F1": "best_f1", "span F1": "span_f1"}
        width = 0.8 / len(series)
        for k, (label, key) in enumerate(series.items()):
            values = [baseline.get(key) or 0.0] + [m.get(key) or 0.0 for _, m in rows]
            bars.bar([i + (k - 1) * width for i in range(len(names))], values, width=width, label=label)
        bars.set_xticks(list(range(len(names))), names, rotation=20, ha="right")
        bars.set_ylabel("held-out score")
        bars.legend()
        for name, points in curves.items():
            if points:
                steps, losses = zip(*points, strict=True)
                lines.plot(steps, moving_mean(losses, max(1, len(losses) // 20)), label=name)
        lines.set_xlabel("fine-tuning step")
        lines.set_ylabel("training loss (moving mean)")
        lines.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001 - the table is the result; the plot is a courtesy
        print(f"(plot skipped: {exc})")


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.2f}"
