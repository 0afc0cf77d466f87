"""`python -m train.finetune`: SQuAD 2.0 fine-tuning (answer span + answerability), original XLNet recipe.

Thin CLI over :class:`train.recipes.finetune.FinetuneRecipe`: the flags become a
:class:`~train.recipes.finetune.FinetuneConfig` (features `P <sep> Q <sep> <cls>` with windows and
max-context, one of the heads shallow / deep / beam / simple, layer freezing, the original's optimiser:
TF-style Adam, clipping, layer-wise decay of the clipped gradients; evaluation every N steps with the
official metrics). `--out` receives the FINAL model and its dev metrics (its metadata carries the
no-answer threshold that export and serving use by default); `--keep-best` also keeps the checkpoint
with the highest dev best_f1 in `--out/best`, labelled with the data it was selected on. `--recipe`
sets the original's published-run settings in one flag.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from qa_core.contract import WINDOW_AND_DECODING
from train.common.cli import Parser, run
from train.common.dataclass_flags import add_flags
from train.engine.run_record import explicit_flags
from train.recipes.finetune import FinetuneConfig, FinetuneRecipe
from train.recipes.presets import RECIPES, recipe_defaults

# The flags in --help's groups, in order: every field of FinetuneConfig that is a flag, each once.
GROUPS: dict[str | None, tuple[str, ...]] = {
    None: ("recipe",),
    "data": (
        "train_file",
        "dev_file",
        "keep_out_of_window",
        "plausible_spans",
        "max_dev_examples",
    ),
    "model": (
        "init",
        "config",
        "spm",
        "train_spm",
        "head",
        "start_n_top",
        "end_n_top",
        "answer_class_input",
        "activation",
        "aoa",
        "question_match",
        "dropout",
        "freeze_layers",
        "freeze_embeddings",
    ),
    # windows and decoding: every field of ModelSettings the run takes (a new setting joins by itself)
    "model settings (recorded in the model, read by evaluation, the export and the server)": WINDOW_AND_DECODING,
    "optimisation": (
        "steps",
        "epochs",
        "batch_size",
        "global_batch_size",
        "grad_accum",
        "lr",
        "layer_decay",
        "layer_decay_on",
        "optimizer",
        "warmup",
        "decay",
        "min_lr_ratio",
        "weight_decay",
        "adam_eps",
        "clip",
        "clip_each_micro_batch",
        "precision",
        "activation_checkpointing",
        "device",
        "seed",
        "threads",
    ),
    "evaluation and run": (
        "out",
        "keep_best",
        "eval_every",
        "eval_batch_size",
        "answerability",
        "calibration",
        "rerank",
        "reranker",
        "log_every",
        "save_every",
        "keep_last",
        "resume",
        "overwrite",
        "stop_after",
        "no_progress",
    ),
}


def build_parser() -> Parser:
    """One flag per field of :class:`FinetuneConfig` (type, default and help from the field), in groups."""
    p = Parser(prog="python -m train.finetune", description=__doc__.splitlines()[0])
    for title, names in GROUPS.items():
        add_flags(p if title is None else p.add_argument_group(title), FinetuneConfig, names)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse flags; `--recipe NAME` first replaces the defaults with that recipe's values."""
    parser = build_parser()
    pre = Parser(add_help=False)
    pre.add_argument("--recipe", choices=sorted(RECIPES))
    pre.add_argument("--batch-size", type=int)
    pre.add_argument("--global-batch-size", type=int)
    pre.add_argument("--epochs", type=float)
    known, _ = pre.parse_known_args(argv)
    if known.batch_size is not None and known.global_batch_size is not None:
        raise ValueError("give --batch-size (per rank) or --global-batch-size, not both")
    if known.recipe:
        defaults = recipe_defaults(known.recipe)
        if known.batch_size is not None:  # an explicit per-rank batch wins over the recipe's global one
            defaults.pop("global_batch_size")
        if known.epochs is not None:  # explicit epochs win over the recipe's step count
            defaults.pop("steps")
        parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    args.explicit_flags = explicit_flags(parser, argv)
    return args


def parse_config(argv: Sequence[str] | None = None) -> FinetuneConfig:
    """The config the command line describes (a --recipe's values as defaults, the flags given kept for
    resume checks)."""
    return FinetuneConfig.from_args(parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    # the data files are checked once the settings to run with are known (--resume restores them)
    FinetuneRecipe(parse_config(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.finetune"))
