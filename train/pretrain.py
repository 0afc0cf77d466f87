"""`python -m train.pretrain`: XLNet permutation language modelling with two-stream attention.

Thin CLI over :class:`train.recipes.pretrain.PretrainRecipe`: the flags become a
:class:`~train.recipes.pretrain.PretrainConfig` (a random model of a preset, its tokenizer given or
trained on the corpus, or with ``--init`` a published model and its tokenizer to continue from; data
streams with span targets and permutation masks, the LM model with Transformer-XL memory carried from
batch to batch, the original's Adam, clipping and warmup/decay, gradient accumulation, atomic resumable
checkpoints, metrics.jsonl + loss PNG, and DistributedDataParallel under torchrun).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from train.common.cli import Parser, run
from train.engine.flags import add_shared_flags, add_step_compute_flags
from train.engine.run_record import add_run_flags, explicit_flags
from train.recipes.pretrain import PretrainConfig, PretrainRecipe

D = PretrainConfig.defaults()


def build_parser() -> Parser:
    p = Parser(prog="python -m train.pretrain", description=__doc__.splitlines()[0])
    add_data_flags(p.add_argument_group("data"))
    add_model_flags(p.add_argument_group("model"))
    add_optimisation_flags(p.add_argument_group("optimisation"))
    add_run_group_flags(p.add_argument_group("run"))
    return p


def add_data_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--corpus",
        nargs="+",
        help="plain-text files (blank line between documents), SQuAD JSON or JSONL files, prepared into the "
        "run directory's data/ first (default: the shipped sample)",
    )
    g.add_argument(
        "--data",
        help="a corpus prepared by python -m train.prepare_corpus: memory-mapped, nothing tokenized at start",
    )
    add_shared_flags(
        g,
        D,
        spm="sentencepiece model to use (spiece.model or a directory holding one)",
        train_spm="train a sentencepiece model of this size on the corpus first (default 8000 when no --spm)",
    )
    g.add_argument(
        "--lower", action="store_true", help="lower-case text (uncased model) when training the spm"
    )
    g.add_argument("--seq-len", type=int, default=D.seq_len, help="tokens per example (paper: 512)")
    g.add_argument(
        "--reuse-len",
        type=int,
        default=D.reuse_len,
        help="tokens cached as memory for the next batch (paper: 256)",
    )
    g.add_argument("--mem-len", type=int, default=D.mem_len, help="memory length in tokens (paper: 384)")
    g.add_argument(
        "--perm-size", type=int, default=D.perm_size, help="local permutation size (default: reuse-len)"
    )
    g.add_argument(
        "--num-predict", type=int, default=D.num_predict, help="targets per example (default: seq-len // 6)"
    )
    g.add_argument("--mask-alpha", type=int, default=D.mask_alpha, help="context tokens per span unit")
    g.add_argument(
        "--mask-beta", type=int, default=D.mask_beta, help="tokens predicted per mask-alpha tokens"
    )
    g.add_argument("--max-gram", type=int, default=D.max_gram, help="longest span length")
    g.add_argument("--bi-data", action="store_true", help="half of each batch reads the streams backwards")


def add_model_flags(g: argparse._ArgumentGroup) -> None:
    add_shared_flags(
        g,
        D,
        init="continue pretraining this model: a HuggingFace XLNetLMHeadModel/XLNetModel directory or our "
        "checkpoint; its shape and spiece.model are used (flags that contradict them are refused)",
        config="model size preset",
    )
    g.add_argument("--n-layer", type=int)
    g.add_argument("--d-model", type=int)
    g.add_argument("--n-head", type=int)
    g.add_argument("--d-inner", type=int)
    add_shared_flags(
        g,
        D,
        dropout="override the preset's dropout",
        activation="feed-forward activation",
        aoa="Attention-on-Attention in every layer",
    )
    g.add_argument(
        "--clamp-len", type=int, default=D.clamp_len, help="clamp relative distances (-1: no clamp)"
    )


def add_optimisation_flags(g: argparse._ArgumentGroup) -> None:
    add_shared_flags(
        g,
        D,
        steps="optimizer steps",
        batch_size="sequences per rank per micro-batch",
        grad_accum="micro-batches per optimizer step",
        lr="peak learning rate (paper: 4e-4 base)",
        warmup="linear warmup steps",
        decay=None,
        min_lr_ratio="final lr as a fraction of the peak (original: 0.001)",
        optimizer="xlnet (original) or adamw",
        weight_decay="original train_gpu.py default: 0",
        adam_eps=None,
        clip="global gradient-norm clip",
    )
    add_step_compute_flags(g, D.precision)
    add_shared_flags(
        g,
        D,
        device="auto, cpu or cuda",
        seed=None,
        threads="torch intra-op threads (default: torch's choice)",
    )


def add_run_group_flags(g: argparse._ArgumentGroup) -> None:
    add_shared_flags(g, D, out="run directory (checkpoint, metrics.jsonl, loss.png)")
    add_run_flags(g)
    add_shared_flags(
        g,
        D,
        log_every=None,
        save_every=None,
        keep_last="step checkpoints to keep",
        stop_after="exit (with a checkpoint) after this many steps of this invocation, as Ctrl-C would; "
        "--resume continues",
        no_progress="no progress bar",
    )


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
