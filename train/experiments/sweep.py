"""`python -m train.sweep`: the fine-tuning trade-off study (CS293S: XLNet on limited hardware).

Grid over max sequence length x frozen bottom layers x head type. Each cell is one short fine-tuning
run (`train.recipes.finetune`) from the same initial checkpoint; we record dev EM/F1/best_f1, seconds
per training step and trainable parameters, and write `sweep.md` (a Markdown table) and `sweep.png`.
Finished cells are skipped on a rerun, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

from qa_core.heads import HEADS
from train.common.cli import Parser
from train.common.dataclass_flags import add_flags
from train.experiments.runs import given
from train.recipes.finetune import FinetuneConfig, FinetuneRecipe


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# The knobs every cell shares are FinetuneConfig's flags (their types, choices and help), with the
# sweep's defaults: short runs of a small model on 2 cores.
CELL_FLAGS = ("train_file", "dev_file", "init", "config", "spm", "max_query_len", "steps", "batch_size", "lr")
CELL_DEFAULTS = {"config": "small", "max_query_len": 64, "steps": 200, "batch_size": 16, "lr": 1e-3}


def build_parser() -> Parser:
    p = Parser(prog="python -m train.sweep", description=__doc__.splitlines()[0])
    add_flags(p, FinetuneConfig, CELL_FLAGS, CELL_DEFAULTS, required=("train_file", "dev_file"))
    p.add_argument(
        "--max-seq-lens", type=int_list, default=[128, 256], help="the grid's windows, comma-separated"
    )
    p.add_argument(
        "--freeze-layers", type=int_list, default=[0, 2], help="the grid's frozen layers, comma-separated"
    )
    p.add_argument(
        "--heads", default="shallow,deep", help=f"the grid's heads, comma-separated: {','.join(HEADS)}"
    )
    add_flags(p, FinetuneConfig, ("max_dev_examples", "out", "seed", "no_progress"))
    return p


def cell_name(seq: int, frozen: int, head: str) -> str:
    return f"seq{seq}-freeze{frozen}-{head}"


def run_cell(args, seq: int, frozen: int, head: str) -> dict:
    out = Path(args.out) / cell_name(seq, frozen, head)
    result_file = out / "cell.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    init = {"init": args.init} if args.init else {"config": args.config, "spm": args.spm}
    settings = {
        "train_file": args.train_file,
        "dev_file": args.dev_file,
        **init,
        "head": head,
        "max_seq_len": seq,
        "doc_stride": seq // 2,
        "freeze_layers": frozen,
        "max_query_len": min(args.max_query_len, seq // 2),
        "steps": args.steps,
        "eval_every": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "out": str(out),
        "log_every": max(1, args.steps // 10),
        "save_every": args.steps,
    }
    if args.max_dev_examples:
        settings["max_dev_examples"] = args.max_dev_examples
    if args.no_progress:
        settings["no_progress"] = True
    settings["resume"] = True  # an interrupted cell continues (a finished one returned above)
    config = given(FinetuneConfig, **settings)
    summary = FinetuneRecipe(config).run()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timings = [r["s_per_step"] for r in records if "s_per_step" in r]
    dev = [r for r in records if "dev_f1" in r][-1]
    meta = json.loads((out / "metadata.json").read_text())
    cell = {
        "max_seq_len": seq,
        "freeze_layers": frozen,
        "head": head,
        "s_per_step": sum(timings) / len(timings) if timings else float("nan"),
        "dev_exact": dev["dev_exact"],
        "dev_f1": dev["dev_f1"],
        "dev_best_f1": summary["final_metrics"]["best_f1"],
        "trainable_params": summary.get("trainable_params", meta.get("trainable_params")),
    }
    result_file.write_text(json.dumps(cell, indent=2))
    return cell


def write_outputs(out: Path, cells: list[dict]) -> None:
    head = "| max_seq_len | frozen layers | head | s/step | dev EM | dev F1 | dev best F1 |"
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        lines.append(
            f"| {c['max_seq_len']} | {c['freeze_layers']} | {c['head']} | {c['s_per_step']:.3f} | "
            f"{c['dev_exact']:.2f} | {c['dev_f1']:.2f} | {c['dev_best_f1']:.2f} |"
        )
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in cells:
        marker = "os^Dv<>P"[HEADS.index(c["head"]) % 8] if c["head"] in HEADS else "o"
        ax.scatter(c["s_per_step"], c["dev_best_f1"], marker=marker, s=30 + 10 * c["max_seq_len"] / 64)
        ax.annotate(
            cell_name(c["max_seq_len"], c["freeze_layers"], c["head"]),
            (c["s_per_step"], c["dev_best_f1"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set_xlabel("seconds per training step")
    ax.set_ylabel("dev best F1")
    ax.set_title("Fine-tuning trade-off: speed vs quality")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.init and not args.spm:
        raise ValueError("give --init CHECKPOINT, or --config PRESET with --spm MODEL")
    heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [
        run_cell(args, s, f, h) for s, f, h in itertools.product(args.max_seq_lens, args.freeze_layers, heads)
    ]
    write_outputs(out, cells)
    print((out / "sweep.md").read_text())
    return 0
