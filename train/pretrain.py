"""`python -m train.pretrain`: XLNet permutation language modelling with two-stream attention.

Thin CLI over :class:`train.recipes.pretrain.PretrainRecipe`: the flags become a
:class:`~train.recipes.pretrain.PretrainConfig` (a random model of a preset, its tokenizer given or
trained on the corpus, or with ``--init`` a published model and its tokenizer to continue from; data
streams with span targets and permutation masks, the LM model with Transformer-XL memory carried from
batch to batch, the original's Adam, clipping and warmup/decay, gradient accumulation, atomic resumable
checkpoints, metrics.jsonl + loss PNG, and DistributedDataParallel under torchrun).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from train.common.cli import Parser, run
from train.common.dataclass_flags import add_flags
from train.engine.run_record import explicit_flags
from train.recipes.pretrain import PretrainConfig, PretrainRecipe

# The flags in --help's groups, in order: every field of PretrainConfig that is a flag, each once.
GROUPS: dict[str, tuple[str, ...]] = {
    "data": (
        "corpus",
        "data",
        "spm",
        "train_spm",
        "lower",
        "seq_len",
        "reuse_len",
        "mem_len",
        "perm_size",
        "num_predict",
        "mask_alpha",
        "mask_beta",
        "max_gram",
        "bi_data",
    ),
    "model": (
        "init",
        "config",
        "n_layer",
        "d_model",
        "n_head",
        "d_inner",
        "dropout",
        "activation",
        "aoa",
        "clamp_len",
    ),
    "optimisation": (
        "steps",
        "batch_size",
        "grad_accum",
        "lr",
        "warmup",
        "decay",
        "min_lr_ratio",
        "optimizer",
        "weight_decay",
        "adam_eps",
        "clip",
        "precision",
        "activation_checkpointing",
        "device",
        "seed",
        "threads",
    ),
    "run": (
        "out",
        "resume",
        "overwrite",
        "log_every",
        "save_every",
        "keep_last",
        "stop_after",
        "no_progress",
    ),
}


def build_parser() -> Parser:
    """One flag per field of :class:`PretrainConfig` (type, default and help from the field), in groups."""
    p = Parser(prog="python -m train.pretrain", description=__doc__.splitlines()[0])
    for title, names in GROUPS.items():
        add_flags(p.add_argument_group(title), PretrainConfig, names)
    return p


def parse_config(argv: Sequence[str] | None = None) -> PretrainConfig:
    """The config the command line describes (the flags it gave kept for resume checks)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.explicit_flags = explicit_flags(parser, argv)
    return PretrainConfig.from_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    PretrainRecipe(parse_config(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.pretrain"))
