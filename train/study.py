"""`python -m train.study`: what pretraining buys, end to end on this machine.

Splits the labelled dev articles into a fine-tuning part and a held-out part, pretrains a model on
the unlabelled corpus, fine-tunes it, fine-tunes the same architecture from random init with the
same budget, evaluates both on the held-out articles and writes `RESULTS.md` (+ PNG) next to the
no-answer baseline of the same questions. Every stage is the public CLI, resumable with --resume.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from train import evaluate as evaluate_cli
from train import finetune as finetune_cli
from train import pretrain as pretrain_cli
from train.cli import Parser, run
from train.squad import evaluate, read_squad, split_by_article, write_squad

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "squad2"


def build_parser() -> Parser:
    p = Parser(prog="python -m train.study", description=__doc__.splitlines()[0])
    p.add_argument(
        "--corpus", nargs="+", default=[str(SHARED / "test-v2.0.cs224n.json")], help="pretraining text"
    )
    p.add_argument(
        "--labelled", default=str(SHARED / "dev-v2.0.cs224n-13.json"), help="SQuAD 2.0 file to split"
    )
    p.add_argument(
        "--finetune-articles", type=int, default=9, help="articles to fine-tune on; the rest evaluate"
    )
    p.add_argument("--config", default="small")
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--pretrain-steps", type=int, default=1000)
    p.add_argument("--pretrain-batch", type=int, default=16)
    p.add_argument("--pretrain-lr", type=float, default=1e-3)
    p.add_argument("--seq-len", type=int, default=128, help="pretraining sequence length")
    p.add_argument("--max-gram", type=int, default=1, help="longest predicted span in pretraining")
    p.add_argument("--finetune-steps", type=int, default=1500)
    p.add_argument("--finetune-batch", type=int, default=16)
    p.add_argument("--finetune-lr", type=float, default=5e-4)
    p.add_argument("--max-seq-len", type=int, default=192, help="fine-tuning window")
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--head", default="shallow")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--out", default="runs/study")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p


def timed(fn, argv: list[str]) -> float:
    t = time.time()
    code = fn(argv)
    if code:
        raise SystemExit(code)
    return time.time() - t


def no_answer_baseline(examples) -> dict:
    preds = {ex.qas_id: "" for ex in examples}
    return evaluate(examples, preds)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tune, held = split_by_article(args.labelled, args.finetune_articles)
    write_squad(tune, out / "finetune.json")
    write_squad(held, out / "heldout.json")
    held_examples = read_squad(out / "heldout.json")
    resume = ["--resume"] if args.resume else []
    quiet = ["--no-progress"] if args.no_progress else []
    seconds: dict[str, float] = {}
    pre = out / "pretrain"
    if not (pre / "model.safetensors").exists() or args.resume:
        seconds["pretrain"] = timed(
            pretrain_cli.main,
            [
                "--corpus",
                *args.corpus,
                str(out / "finetune.json"),  # the fine-tuning articles' text is unlabelled text too
                "--config",
                args.config,
                "--train-spm",
                str(args.vocab),
                "--steps",
                str(args.pretrain_steps),
                "--batch-size",
                str(args.pretrain_batch),
                "--lr",
                str(args.pretrain_lr),
                "--seq-len",
                str(args.seq_len),
                "--reuse-len",
                str(args.seq_len // 2),
                "--mem-len",
                str(args.seq_len // 2),
                "--warmup",
                str(args.pretrain_steps // 20),
                "--max-gram",
                str(args.max_gram),
                "--out",
                str(pre),
                "--save-every",
                "250",
                *resume,
                *quiet,
            ],
        )
    common = [
        "--train-file",
        str(out / "finetune.json"),
        "--dev-file",
        str(out / "heldout.json"),
        "--head",
        args.head,
        "--steps",
        str(args.finetune_steps),
        "--batch-size",
        str(args.finetune_batch),
        "--lr",
        str(args.finetune_lr),
        "--max-seq-len",
        str(args.max_seq_len),
        "--doc-stride",
        str(args.doc_stride),
        "--eval-every",
        str(args.eval_every),
        "--save-every",
        str(args.eval_every),
        "--layer-decay",
        "0.9",
        *resume,
        *quiet,
    ]
    runs = {
        "pretrained": ["--init", str(pre)],
        "random init": ["--config", args.config, "--spm", str(pre / "tokenizer")],
    }
    rows = []
    for name, init in runs.items():
        ft = out / f"finetune-{name.replace(' ', '-')}"
        if not (ft / "metadata.json").exists() or args.resume:
            seconds[f"finetune {name}"] = timed(finetune_cli.main, [*common, *init, "--out", str(ft)])
        ev = out / f"eval-{name.replace(' ', '-')}"
        timed(
            evaluate_cli.main,
            ["--checkpoint", str(ft), "--data", str(out / "heldout.json"), "--out", str(ev), *quiet],
        )
        metrics = json.loads((ev / "metrics.json").read_text())
        metrics.update(span_quality(held_examples, json.loads((ev / "nbest.json").read_text())))
        rows.append((name, metrics))
    baseline = no_answer_baseline(held_examples)
    write_report(
        out, args, rows, baseline, seconds, len(read_squad(out / "finetune.json")), len(held_examples)
    )
    print((out / "RESULTS.md").read_text())
    return 0


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


def write_report(out: Path, args, rows, baseline, seconds, n_tune: int, n_held: int) -> None:
    keys = [
        "exact",
        "f1",
        "HasAns_exact",
        "HasAns_f1",
        "NoAns_exact",
        "NoAns_f1",
        "best_exact",
        "best_f1",
        "span_exact",
        "span_f1",
    ]
    lines = [
        "| model | " + " | ".join(keys) + " |",
        "| --- |" + " --- |" * len(keys),
        "| no-answer baseline | " + " | ".join(f"{baseline.get(k, float('nan')):.2f}" for k in keys) + " |",
    ]
    for name, m in rows:
        lines.append(
            f"| {args.config}, {name} | " + " | ".join(f"{m.get(k, float('nan')):.2f}" for k in keys) + " |"
        )
    text = [
        f"# End-to-end study ({args.config} preset, {args.head} head)",
        "",
        f"Fine-tuned on {n_tune} questions ({args.finetune_articles} articles), evaluated on {n_held} held-out "
        f"questions. Pretraining: {args.pretrain_steps} steps x {args.pretrain_batch} x {args.seq_len} tokens; "
        f"fine-tuning: {args.finetune_steps} steps x {args.finetune_batch} windows of {args.max_seq_len}.",
        "",
        *lines,
        "",
        "span_exact / span_f1: the best span on the answerable held-out questions with the no-answer "
        "decision switched off (span-extraction quality alone).",
        "",
        "Wall-clock seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()),
        "",
    ]
    (out / "RESULTS.md").write_text("\n".join(text))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        names = ["no-answer"] + [n for n, _ in rows]
        f1 = [baseline["f1"]] + [m["f1"] for _, m in rows]
        best = [baseline["f1"]] + [m["best_f1"] for _, m in rows]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], f1, width=0.4, label="F1 (stored threshold)")
        ax.bar([i + 0.2 for i in x], best, width=0.4, label="best F1")
        ax.set_xticks(list(x), names)
        ax.set_ylabel("held-out F1")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "study.png", dpi=100)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001 - the table is the result; the plot is a courtesy
        print(f"(plot skipped: {exc})")


if __name__ == "__main__":
    sys.exit(run(main, prog="train.study"))
