"""`python -m train.ablation`: activation / Attention-on-Attention grid at equal budget and seeds.

The CS224N report "SOTA Attention Mechanism and Activation Functions on XLNet" pretrained XLNet with
ReLU, GELU, Mish and Mish + Attention-on-Attention and compared the best pretraining loss (mean of
3 runs) and SQuAD 2.0 dev F1. This runs the same grid here: every configuration pretrains with the
same tokenizer, data, steps, learning rate and seeds (`train.recipes.pretrain`), optionally fine-tunes
(`train.recipes.finetune`), and the results are written as `ablation.md` (mean ± sd over seeds),
`results.json` and `ablation.png` (loss curves: mean over seeds, band = min..max). Cells that
finished are reused, so an interrupted grid continues where it stopped.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from qa_core.squad import load_dataset, read_squad, split_by_article, write_squad
from qa_core.squad.answerability import from_metadata
from train.common.cli import Parser
from train.common.dataclass_flags import add_flags
from train.common.sample_data import SAMPLE_CORPUS
from train.engine.runlog import read_series
from train.evaluation.predict import evaluate_predictions, redecide
from train.experiments.heldout import predict_file, score_rule, span_f1
from train.experiments.runs import given, short_pretraining
from train.model import ACTIVATIONS, PRESETS
from train.recipes.finetune import FinetuneConfig, FinetuneRecipe
from train.recipes.pretrain import PretrainConfig, PretrainRecipe
from train.tokenizer import train_spm

CONFIGS = ("relu", "gelu", "mish", "mish+aoa")


def parse_config(name: str) -> tuple[str, bool]:
    """'mish+aoa' -> ('mish', True); 'gelu' -> ('gelu', False)."""
    activation, _, extra = name.partition("+")
    if activation not in ACTIVATIONS or extra not in ("", "aoa"):
        raise ValueError(
            f"unknown configuration {name!r}: use ACTIVATION or ACTIVATION+aoa, ACTIVATION in {ACTIVATIONS}"
        )
    return activation, extra == "aoa"


PRETRAIN_FLAGS = ("steps", "batch_size", "seq_len", "lr", "max_gram", "log_every", "threads")
PRETRAIN_DEFAULTS = {"steps": 300, "batch_size": 16, "seq_len": 128, "lr": 1e-3, "max_gram": 1}


def build_parser() -> Parser:
    p = Parser(prog="python -m train.ablation", description=__doc__.splitlines()[0])
    p.add_argument("--corpus", nargs="+", default=[str(SAMPLE_CORPUS)], help="pretraining text")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, e.g. relu,gelu,mish+aoa")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (runs per configuration)")
    p.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model size preset")
    p.add_argument("--vocab", type=int, default=4000, help="tokenizer trained once on the corpus")
    # each cell's pretraining: PretrainConfig's flags, with the ablation's defaults
    add_flags(p, PretrainConfig, PRETRAIN_FLAGS, PRETRAIN_DEFAULTS)
    g = p.add_argument_group("optional fine-tuning of every pretrained model")
    g.add_argument("--train-file", help="SQuAD 2.0 training file (fine-tunes each cell when given)")
    g.add_argument("--dev-file", help="SQuAD 2.0 file to evaluate on (questions never trained on)")
    g.add_argument(
        "--calibration-file",
        help="SQuAD 2.0 articles held out of fine-tuning, where each model's answerability is fitted (never "
        "the scored --dev-file; 2+ articles, so it is cross-fitted by article); default: the last 2 articles of "
        "--train-file, held out of fine-tuning",
    )
    defaults = {"steps": 300, "lr": 5e-4, "batch_size": 16}
    spell = {"batch_size": "--finetune-batch"}
    add_flags(g, FinetuneConfig, ("steps", "lr", "batch_size"), defaults, prefix="finetune", spell=spell)
    add_flags(g, FinetuneConfig, ("max_seq_len", "head", "question_match"), {"max_seq_len": 192})
    add_flags(p, FinetuneConfig, ("out", "no_progress"))
    return p


def pretrain_cell(args, out: Path, config: str, seed: int, spm: Path) -> dict:
    activation, aoa = parse_config(config)
    cell = out / f"{config.replace('+', '-')}-seed{seed}"
    t = time.time()
    if not (cell / "model.safetensors").exists():
        settings = short_pretraining(
            args.corpus, spm, args.preset, args.steps, args.batch_size, args.seq_len, args.lr, args.max_gram
        )
        settings |= {"activation": activation, **({"aoa": True} if aoa else {}), "seed": seed}
        settings |= {"log_every": args.log_every, "save_every": args.steps, "out": str(cell)}
        settings |= {**({"threads": args.threads} if args.threads else {}), "resume": True}
        settings |= {"no_progress": True} if args.no_progress else {}
        PretrainRecipe(given(PretrainConfig, **settings)).run()
    curve = read_series(cell)
    result = {
        "config": config,
        "seed": seed,
        "dir": str(cell),
        "best_loss": min(loss for _, loss in curve),
        "final_loss": curve[-1][1],
        "curve": curve,
        "seconds": time.time() - t,
    }
    if args.train_file:
        result.update(finetune_cell(args, cell, seed))
    return result


def finetune_cell(args, cell: Path, seed: int) -> dict:
    """Fine-tune (answerability fitted on the calibration articles), then score on the dev file."""
    ft = cell / "finetune"
    if not (ft / "metadata.json").exists():
        settings = {"init": str(cell), "train_file": args.fit_file, "dev_file": args.calibration_file}
        settings |= {"head": args.head, "steps": args.finetune_steps, "lr": args.finetune_lr}
        settings |= {"batch_size": args.finetune_batch, "max_seq_len": args.max_seq_len}
        settings |= {"max_query_len": min(64, args.max_seq_len // 3)}
        settings |= {"doc_stride": min(128, args.max_seq_len // 2)}
        settings |= {"eval_every": args.finetune_steps, "save_every": args.finetune_steps}
        settings |= {"seed": seed, "out": str(ft), "resume": True}
        settings |= {"question_match": True} if args.question_match else {}
        settings |= {"threads": args.threads} if args.threads else {}
        settings |= {"no_progress": True} if args.no_progress else {}
        FinetuneRecipe(given(FinetuneConfig, **settings)).run()
    meta = json.loads((ft / "metadata.json").read_text())
    held = predict_file(ft, read_squad(args.dev_file))
    row = score_rule("final", from_metadata(meta), held)
    best = redecide(held.examples, held.predictions, None)
    return {
        "dev_f1": row.f1,
        "dev_f1_minus_none": row.diff,
        "dev_f1_minus_none_ci": [row.low, row.high],
        "dev_has_ans_f1": row.has_ans_f1 if row.has_ans_f1 is not None else float("nan"),
        "dev_span_f1": span_f1(held),
        "dev_best_f1": evaluate_predictions(held.examples, best)["best_f1"],
    }


CALIBRATION_ARTICLES = 2  # the fewest that cross-fit by article (one would fall back to paragraphs)


def calibration_split(args, out: Path) -> tuple[str, str]:
    """(fine-tuning file, calibration file): --calibration-file, else the train file's last two
    articles, held out of fine-tuning. Either way the calibration holds 2+ articles, so the
    answerability is cross-fitted by article, never by paragraphs of one article."""
    if args.calibration_file:
        if not Path(args.calibration_file).exists():
            raise FileNotFoundError(f"file not found: {args.calibration_file}")
        if len(load_dataset(args.calibration_file)["data"]) < CALIBRATION_ARTICLES:
            raise ValueError(
                f"{args.calibration_file} has one article: the answerability is cross-fitted by article, "
                f"so give {CALIBRATION_ARTICLES} or more"
            )
        return args.train_file, args.calibration_file
    n = len(load_dataset(args.train_file)["data"])
    if n <= CALIBRATION_ARTICLES:
        raise ValueError(
            f"{args.train_file} has {n} article(s), and the answerability is cross-fitted by article on "
            f"{CALIBRATION_ARTICLES}+ held-out ones: give --calibration-file, or a training file with more articles"
        )
    fit, calibration = split_by_article(args.train_file, n - CALIBRATION_ARTICLES)
    paths = out / "fit.json", out / "calibration.json"
    write_squad(fit, paths[0])
    write_squad(calibration, paths[1])
    print(
        f"answerability is fitted on {paths[1]} (the last {CALIBRATION_ARTICLES} articles of {args.train_file}, "
        "not fine-tuned on)"
    )
    return str(paths[0]), str(paths[1])


def mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def write_report(out: Path, args, results: list[dict]) -> None:
    """ablation.md (the table per configuration), results.json and the loss plot."""
    configs = list(dict.fromkeys(r["config"] for r in results))
    tuned = "dev_f1" in results[0]
    seeds = sorted({r["seed"] for r in results})
    text = [
        f"# Activation / AoA ablation ({args.preset} preset)",
        "",
        f"Pretraining: {args.steps} steps x {args.batch_size} x {args.seq_len} tokens, lr {args.lr:g}, "
        f"max_gram {args.max_gram}, seeds {seeds}; the same tokenizer and data for every run. "
        "Loss: mean cross-entropy per predicted token over each log interval; best = the lowest interval.",
        "",
        *_results_table(results, configs, tuned),
        "",
    ]
    if tuned:
        text += _finetuning_note(args, results)
    (out / "ablation.md").write_text("\n".join(text))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot_losses(out / "ablation.png", results, configs)


def _results_table(results: list[dict], configs: list[str], tuned: bool) -> list[str]:
    """One row per configuration: mean ± sd over its seeds (and the dev scores when fine-tuned)."""
    cols = ["configuration", "runs", "best pretraining loss (nats/token)", "final loss"]
    if tuned:
        cols += ["dev F1", "dev F1 - none", "dev HasAns F1", "dev span F1", "dev best_f1 (upper bound)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for c in configs:
        rows = [r for r in results if r["config"] == c]
        cells = [
            c,
            str(len(rows)),
            mean_sd([r["best_loss"] for r in rows]),
            mean_sd([r["final_loss"] for r in rows]),
        ]
        if tuned:
            keys = ("dev_f1", "dev_f1_minus_none", "dev_has_ans_f1", "dev_span_f1", "dev_best_f1")
            cells += [mean_sd([r[k] for r in rows]) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _finetuning_note(args, results: list[dict]) -> list[str]:
    """How the fine-tuned columns were made, with every run's difference from answering none."""
    return [
        f"Fine-tuning: {args.finetune_steps} steps x {args.finetune_batch} windows of {args.max_seq_len}, "
        f"{args.head} head{' with the exact-match feature' if args.question_match else ''}, "
        f"on {args.fit_file}; answerability fitted on {args.calibration_file} (cross-fitted by article); "
        f"scored on {args.dev_file} (final model), where nothing was fitted or chosen. dev F1 - none: the "
        "difference from answering none (per run: "
        + "; ".join(
            f"{r['config']} seed {r['seed']} {r['dev_f1_minus_none']:+.2f} "
            f"[{r['dev_f1_minus_none_ci'][0]:+.2f}, {r['dev_f1_minus_none_ci'][1]:+.2f}]"
            for r in results
        )
        + ", paired bootstrap 95% intervals). best_f1: the threshold searched on the scored questions "
        "themselves, an upper bound that no deployed model gets.",
        "",
    ]


def plot_losses(path: Path, results: list[dict], configs: list[str]) -> None:
    """Pretraining loss per configuration: the mean over seeds, with a min..max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for c in configs:
        curves = [r["curve"] for r in results if r["config"] == c]
        n = min(len(cv) for cv in curves)
        steps = [s for s, _ in curves[0][:n]]
        by_step = list(zip(*[[loss for _, loss in cv[:n]] for cv in curves], strict=True))
        mean = [statistics.mean(v) for v in by_step]
        (line,) = ax.plot(steps, mean, label=f"{c} (n={len(curves)})")
        ax.fill_between(
            steps, [min(v) for v in by_step], [max(v) for v in by_step], color=line.get_color(), alpha=0.2
        )
    ax.set_xlabel("pretraining step")
    ax.set_ylabel("loss (nats per predicted token)")
    ax.set_title("Pretraining loss: mean over seeds, band = min..max")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        parse_config(c)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    if not configs or not seeds:
        raise ValueError("give at least one configuration and one seed")
    if bool(args.train_file) != bool(args.dev_file):
        raise ValueError("fine-tuning needs both --train-file and --dev-file")
    for f in [*args.corpus, *([args.train_file, args.dev_file] if args.train_file else [])]:
        if not Path(f).exists():
            raise FileNotFoundError(f"file not found: {f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.train_file:
        args.fit_file, args.calibration_file = calibration_split(args, out)
    spm = out / "tokenizer"
    if not (spm / "spiece.model").exists():
        train_spm(args.corpus, spm, args.vocab)
    results = []
    for config in configs:
        for seed in seeds:
            r = pretrain_cell(args, out, config, seed, spm)
            extra = f", dev F1 {r['dev_f1']:.2f}" if "dev_f1" in r else ""
            print(
                f"{config} seed {seed}: best loss {r['best_loss']:.3f}, final {r['final_loss']:.3f}{extra}",
                flush=True,
            )
            results.append(r)
    write_report(out, args, results)
    print((out / "ablation.md").read_text())
    return 0
