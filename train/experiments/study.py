"""`python -m train.experiments.study`: the whole recipe on this machine, end to end, with honest held-out scores.

tokenizer -> pretraining on unlabelled text -> (optional) a stage on self-supervised cloze questions
(`train.experiments.synth`) -> SQuAD 2.0 fine-tuning -> evaluation on questions the model never trained on,
next to the no-answer baseline of the same questions. Several runs can be compared in one call
(`--runs pretrained,random`: what pretraining buys; `+synth`: what the synthetic stage buys;
`+match`: what the exact-match input feature buys); shared stages run once. Every stage is the public CLI and is reused when its output exists,
so an interrupted study continues with `--resume`. Seconds per stage are printed and reported.

Data: `--train-file` / `--eval-file`, or `--labelled FILE` split by article (`--finetune-articles`
to fine-tune on, the rest evaluated). `--calibration-articles` articles of the fine-tuning side are
held out of fine-tuning: the answerability model (how the question verifier and the model's scores
combine, its calibration, threshold and decision rule) is cross-fitted there, and the question
verifier on the fine-tuning articles, never on the evaluated questions (`--calibration-articles 0`
fits on the evaluation file itself, and the report says so). Every answerability rule (today's cls
threshold, model scores, the word-overlap verifier + span, the final combination) is reported side by
side on the evaluated questions, with the difference from answering none and its paired bootstrap
95% interval, the ROC AUC of each score and a reliability plot.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from train import evaluate as evaluate_cli
from train import finetune as finetune_cli
from train import pretrain as pretrain_cli
from train import tokenizer as tokenizer_cli
from train.common.cli import Parser, run
from train.common.sample_data import SAMPLE_DIR as SAMPLE
from train.engine.optim import OPTIMIZERS
from train.engine.runlog import read_series
from train.experiments import synth as synth_cli
from train.experiments.heldout import aucs_table, compare_rules, plot_reliability, predict_file, rows_table
from train.squad import evaluate, load_dataset, read_squad, split_by_article, write_squad

BASES = ("pretrained", "random")
MODIFIERS = ("synth", "match", "plausible", "hard")


def build_parser() -> Parser:
    p = Parser(prog="python -m train.experiments.study", description=__doc__.splitlines()[0])
    g = p.add_argument_group("data")
    g.add_argument("--train-file", default=str(SAMPLE / "train.json"), help="SQuAD 2.0 file to fine-tune on")
    g.add_argument("--eval-file", default=str(SAMPLE / "dev.json"), help="SQuAD 2.0 file to evaluate on")
    g.add_argument("--labelled", help="instead: one SQuAD 2.0 file split by article into train and eval")
    g.add_argument("--finetune-articles", type=int, default=9, help="with --labelled: articles to train on")
    g.add_argument(
        "--calibration-articles",
        "--threshold-articles",
        dest="calibration_articles",
        type=int,
        default=None,
        help="fine-tuning-side articles held out of fine-tuning, where the answerability model (combination, "
        "calibration, threshold, rule) is fitted by cross-fitting (default 2 with --labelled; 0: on the eval "
        "file itself, optimistic)",
    )
    g.add_argument(
        "--calibration-file",
        help="with --train-file: articles held out of fine-tuning to fit the answerability on (default: the "
        "sample's calibration.json with the sample's files, else --calibration-articles of --train-file)",
    )
    g.add_argument(
        "--corpus", nargs="+", default=[str(SAMPLE / "corpus.json")], help="unlabelled pretraining text"
    )
    g = p.add_argument_group("runs")
    g.add_argument(
        "--runs",
        default="pretrained,random",
        help="comma-separated: pretrained | random, each optionally +synth (e.g. pretrained+synth)",
    )
    g.add_argument("--config", default="small", help="model preset")
    g.add_argument("--vocab", type=int, default=4000)
    g.add_argument("--head", default="shallow")
    g.add_argument("--threads", type=int, default=None, help="torch threads per stage")
    g = p.add_argument_group("pretraining")
    g.add_argument("--pretrain-steps", type=int, default=1000)
    g.add_argument("--pretrain-batch", type=int, default=16)
    g.add_argument("--pretrain-lr", type=float, default=1e-3)
    g.add_argument("--seq-len", type=int, default=128, help="pretraining sequence length")
    g.add_argument("--max-gram", type=int, default=1, help="longest predicted span in pretraining")
    g.add_argument("--pretrain-optimizer", choices=OPTIMIZERS, default="xlnet")
    g.add_argument("--pretrain-weight-decay", type=float, default=0.0)
    g = p.add_argument_group("synthetic-question stage (runs named ...+synth)")
    g.add_argument("--synth-steps", type=int, default=1000)
    g.add_argument("--synth-lr", type=float, default=5e-4)
    g.add_argument("--synth-answerable", type=float, default=0.5)
    g.add_argument("--synth-in-place", type=float, default=0.5)
    g.add_argument("--synth-per-sentence", type=int, default=2)
    g.add_argument(
        "--synth-keep-out-of-window", type=float, default=1.0, help="share of answer-less windows kept"
    )
    g.add_argument(
        "--synth-hard-negatives",
        type=float,
        default=0.5,
        help="runs named ...+hard: share of unanswerable synthetic questions made by an edit",
    )
    g = p.add_argument_group("fine-tuning")
    g.add_argument("--finetune-steps", type=int, default=1500)
    g.add_argument("--finetune-batch", type=int, default=16)
    g.add_argument("--finetune-lr", type=float, default=5e-4)
    g.add_argument("--layer-decay", type=float, default=0.9)
    g.add_argument("--max-seq-len", type=int, default=192, help="fine-tuning window")
    g.add_argument("--doc-stride", type=int, default=128)
    g.add_argument("--eval-every", type=int, default=500)
    g.add_argument("--keep-out-of-window", type=float, default=1.0, help="share of answer-less windows kept")
    p.add_argument("--out", default="runs/study")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p


class Stages:
    """Runs each stage once (skipped when its output exists) and records its seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, done: Path, fn, argv: list[str]) -> None:
        if done.exists():
            print(f"[{name}] reusing {done.parent}", flush=True)
            return
        print(f"[{name}] starting", flush=True)
        t = time.time()
        code = fn(argv)
        if code:
            raise SystemExit(code)
        self.seconds[name] = time.time() - t
        print(f"[{name}] done in {self.seconds[name] / 60:.1f} min", flush=True)


def short_pretraining_argv(
    corpus: Sequence[str],
    spm: Path,
    preset: str,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float,
    max_gram: int,
) -> list[str]:
    """`train.pretrain` flags of a CPU-sized run: memory and reuse of half a sequence, 5% warmup."""
    argv = ["--corpus", *corpus, "--spm", str(spm), "--config", preset, "--steps", str(steps)]
    argv += ["--batch-size", str(batch_size), "--seq-len", str(seq_len), "--lr", str(lr)]
    argv += ["--reuse-len", str(seq_len // 2), "--mem-len", str(seq_len // 2)]
    return argv + ["--warmup", str(max(1, steps // 20)), "--max-gram", str(max_gram)]


@dataclass(frozen=True)
class Run:
    """One compared run: its start (pretrained or random) and what it adds (synthetic stage, match feature)."""

    base: str
    synth: bool = False
    match: bool = False
    plausible: bool = False  # --plausible-spans in every QA stage
    hard: bool = (
        False  # the synthetic stage's questions include hard negatives (train.experiments.hard_negatives)
    )

    @property
    def name(self) -> str:
        return "+".join([self.base, *(m for m in MODIFIERS if getattr(self, m))])

    @property
    def slug(self) -> str:
        return self.name.replace("+", "-")


def parse_runs(text: str) -> list[Run]:
    runs = []
    for name in (r.strip() for r in text.split(",") if r.strip()):
        base, *extras = name.split("+")
        if base not in BASES or any(e not in MODIFIERS for e in extras) or len(set(extras)) < len(extras):
            raise ValueError(
                f"unknown run {name!r}: use pretrained or random, optionally +synth, +match, +plausible, +hard"
            )
        if "hard" in extras and "synth" not in extras:
            raise ValueError(f"run {name!r}: +hard changes the synthetic stage, so it needs +synth")
        runs.append(Run(base, **{m: m in extras for m in MODIFIERS}))
    if not runs:
        raise ValueError("--runs is empty")
    return runs


def prepare_data(args, out: Path) -> tuple[Path, Path, Path, bool]:
    """Write fit.json (fine-tuning), calibration.json (answerability) and eval.json; returns them and
    whether the calibration articles come from the fine-tuning side."""
    if args.labelled:
        train, held = split_by_article(args.labelled, args.finetune_articles)
    else:
        for f in (args.train_file, args.eval_file, args.calibration_file or args.train_file):
            if not Path(f).exists():
                raise FileNotFoundError(f"data file not found: {f}")
        train, held = load_dataset(args.train_file), load_dataset(args.eval_file)
        sample = Path(args.train_file).resolve() == (SAMPLE / "train.json").resolve()
        if args.calibration_file is None and args.calibration_articles is None and sample:
            args.calibration_file = str(SAMPLE / "calibration.json")
        if args.calibration_file and args.calibration_articles != 0:
            return _write_splits(out, train, load_dataset(args.calibration_file), held, True)
    if args.calibration_articles is None:
        args.calibration_articles = 2
    n_train = len(train["data"])
    if args.calibration_articles:
        if args.calibration_articles >= n_train:
            raise ValueError(
                f"--calibration-articles {args.calibration_articles} leaves no article to fine-tune on "
                f"({n_train} in the training data)"
            )
        fit, thr = split_by_article(train, n_train - args.calibration_articles)
    else:
        fit, thr = train, held
    return _write_splits(out, fit, thr, held, bool(args.calibration_articles))


def _write_splits(out: Path, fit, calibration, held, honest: bool) -> tuple[Path, Path, Path, bool]:
    paths = out / "fit.json", out / "calibration.json", out / "eval.json"
    for data, path in zip((fit, calibration, held), paths, strict=True):
        write_squad(data, path)
    return *paths, honest


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = parse_runs(args.runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fit, thr, held, honest_threshold = prepare_data(args, out)
    quiet = ["--no-progress"] if args.no_progress else []
    resume = ["--resume"] if args.resume else []
    threads = ["--threads", str(args.threads)] if args.threads else []
    stages = Stages()
    tok = out / "tokenizer"
    # the fine-tuning articles' text is unlabelled text too
    tok_argv = ["--input", *args.corpus, str(fit), "--vocab-size", str(args.vocab), "--out", str(tok)]
    stages.run("tokenizer", tok / "spiece.model", tokenizer_cli.main, tok_argv)
    pre = out / "pretrain"
    if any(r.base == "pretrained" for r in runs):
        argv_pre = short_pretraining_argv(
            [*args.corpus, str(fit)],
            tok,
            args.config,
            args.pretrain_steps,
            args.pretrain_batch,
            args.seq_len,
            args.pretrain_lr,
            args.max_gram,
        )
        argv_pre += [
            "--optimizer",
            args.pretrain_optimizer,
            "--weight-decay",
            str(args.pretrain_weight_decay),
        ]
        argv_pre += ["--out", str(pre), "--save-every", "250", *resume, *quiet, *threads]
        stages.run("pretrain", pre / "model.safetensors", pretrain_cli.main, argv_pre)
    synth_files = {False: out / "synthetic.json", True: out / "synthetic-hard.json"}
    for hard in sorted({r.hard for r in runs if r.synth}):
        synth_argv = ["--input", *args.corpus, str(fit), "--out", str(synth_files[hard])]
        synth_argv += ["--answerable", str(args.synth_answerable), "--in-place", str(args.synth_in_place)]
        synth_argv += ["--per-sentence", str(args.synth_per_sentence)]
        if hard:
            synth_argv += ["--hard-negatives", str(args.synth_hard_negatives)]
        stages.run(
            f"synthetic questions{' (hard)' if hard else ''}", synth_files[hard], synth_cli.main, synth_argv
        )
    finetune_common = ["--dev-file", str(thr), "--head", args.head, "--batch-size", str(args.finetune_batch)]
    finetune_common += ["--max-seq-len", str(args.max_seq_len), "--doc-stride", str(args.doc_stride)]
    finetune_common += ["--layer-decay", str(args.layer_decay), *resume, *quiet, *threads]

    def finetune_argv(
        init: list[str], train_file: Path, run_dir: Path, steps: int, lr: float, keep: float, every: int
    ) -> list[str]:
        argv = [*finetune_common, *init, "--train-file", str(train_file), "--out", str(run_dir)]
        argv += ["--steps", str(steps), "--lr", str(lr), "--keep-out-of-window", str(keep)]
        return argv + ["--eval-every", str(every), "--save-every", str(every)]

    held_examples = read_squad(held)
    fit_examples = read_squad(fit)
    comparisons: list = []
    rows = []
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in runs:
        init = (
            ["--init", str(pre)] if r.base == "pretrained" else ["--config", args.config, "--spm", str(tok)]
        )
        if r.match:
            init.append("--question-match")
        if r.plausible:
            init.append("--plausible-spans")
        if r.synth:
            stage = out / (
                "synth-stage-"
                + "-".join([r.base, *(m for m in ("match", "plausible", "hard") if getattr(r, m))])
            )
            argv_s = finetune_argv(
                init,
                synth_files[r.hard],
                stage,
                args.synth_steps,
                args.synth_lr,
                args.synth_keep_out_of_window,
                args.synth_steps,
            )
            argv_s += ["--answerability", "cls"]  # a stage: its successor fits the answerability
            stages.run(f"synthetic stage ({stage.name})", stage / "metadata.json", finetune_cli.main, argv_s)
            init = ["--init", str(stage), *(["--plausible-spans"] if r.plausible else [])]
        name, slug = r.name, r.slug
        ft = out / f"finetune-{slug}"
        argv_f = finetune_argv(
            init, fit, ft, args.finetune_steps, args.finetune_lr, args.keep_out_of_window, args.eval_every
        )
        stages.run(f"fine-tune ({name})", ft / "metadata.json", finetune_cli.main, argv_f)
        ev = out / f"eval-{slug}"
        stages.run(
            f"evaluate ({name})",
            ev / "metrics.json",
            evaluate_cli.main,
            ["--checkpoint", str(ft), "--data", str(held), "--out", str(ev), *quiet],
        )
        metrics = json.loads((ev / "metrics.json").read_text())
        metrics.update(span_quality(held_examples, json.loads((ev / "nbest.json").read_text())))
        rows.append((name, metrics))
        curves[name] = read_series(ft) if (ft / "metrics.jsonl").exists() else []
        print(f"[compare answerability rules ({name})] starting", flush=True)
        stored = json.loads((ft / "metadata.json").read_text())
        calibration = predict_file(ft, read_squad(thr), progress=not args.no_progress)
        evaluated = predict_file(ft, held_examples, progress=not args.no_progress)
        comparisons.append((name, compare_rules(stored, fit_examples, calibration, evaluated)))
    baseline = no_answer_baseline(held_examples)
    write_report(
        out, args, rows, baseline, stages.seconds, len(fit_examples), held_examples, honest_threshold
    )
    with open(out / "RESULTS.md", "a") as fh:
        fh.write("\n".join(comparison_section(comparisons, honest_threshold)) + "\n")
    (out / "comparison.json").write_text(json.dumps(comparison_json(comparisons), indent=2))
    plot_study(out / "study.png", rows, baseline, curves)
    plot_reliability(out / "reliability.png", comparisons)
    print((out / "RESULTS.md").read_text())
    return 0


def comparison_section(comparisons, honest: bool) -> list[str]:
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
        "difference from answering none, with its paired bootstrap 95% interval over questions. CV F1: what "
        "the rule's own cross-validation over calibration articles expected (against answering none there).",
        "",
        *rows_table(comparisons),
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


def write_report(out: Path, args, rows, baseline, seconds, n_fit: int, held_examples, honest: bool) -> None:
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
        f"({n_ans} answerable). Answerability fitted on {where}. Pretraining: {args.pretrain_steps} "
        f"steps x {args.pretrain_batch} x {args.seq_len} tokens; synthetic stage: {args.synth_steps} steps; "
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


if __name__ == "__main__":
    sys.exit(run(main, prog="train.experiments.study"))
