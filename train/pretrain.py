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
from train.engine.flags import add_step_compute_flags
from train.engine.optim import DECAYS, OPTIMIZERS
from train.engine.run_record import add_run_flags, explicit_flags
from train.model import ACTIVATIONS, PRESETS
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
    g.add_argument("--spm", help="sentencepiece model to use (spiece.model or a directory holding one)")
    g.add_argument(
        "--train-spm",
        type=int,
        metavar="VOCAB_SIZE",
        default=D.train_spm,
        help="train a sentencepiece model of this size on the corpus first (default 8000 when no --spm)",
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
    g.add_argument(
        "--init",
        help="continue pretraining this model: a HuggingFace XLNetLMHeadModel/XLNetModel directory or our "
        "checkpoint; its shape and spiece.model are used (flags that contradict them are refused)",
    )
    g.add_argument("--config", default=D.config, choices=sorted(PRESETS), help="model size preset")
    g.add_argument("--n-layer", type=int)
    g.add_argument("--d-model", type=int)
    g.add_argument("--n-head", type=int)
    g.add_argument("--d-inner", type=int)
    g.add_argument("--dropout", type=float, default=D.dropout, help="override the preset's dropout")
    g.add_argument("--activation", choices=ACTIVATIONS, default=D.activation, help="feed-forward activation")
    g.add_argument("--aoa", action="store_true", help="Attention-on-Attention in every layer")
    g.add_argument(
        "--clamp-len", type=int, default=D.clamp_len, help="clamp relative distances (-1: no clamp)"
    )


def add_optimisation_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--steps", type=int, default=D.steps, help="optimizer steps")
    g.add_argument("--batch-size", type=int, default=D.batch_size, help="sequences per rank per micro-batch")
    g.add_argument("--grad-accum", type=int, default=D.grad_accum, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, default=D.lr, help="peak learning rate (paper: 4e-4 base)")
    g.add_argument("--warmup", type=int, default=D.warmup, help="linear warmup steps")
    g.add_argument("--decay", choices=DECAYS, default=D.decay)
    g.add_argument(
        "--min-lr-ratio",
        type=float,
        default=D.min_lr_ratio,
        help="final lr as a fraction of the peak (original: 0.001)",
    )
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=D.optimizer, help="xlnet (original) or adamw")
    g.add_argument(
        "--weight-decay", type=float, default=D.weight_decay, help="original train_gpu.py default: 0"
    )
    g.add_argument("--adam-eps", type=float, default=D.adam_eps)
    g.add_argument("--clip", type=float, default=D.clip, help="global gradient-norm clip")
    add_step_compute_flags(g, D.precision)
    g.add_argument("--device", default=D.device, help="auto, cpu or cuda")
    g.add_argument("--seed", type=int, default=D.seed)
    g.add_argument(
        "--threads", type=int, default=D.threads, help="torch intra-op threads (default: torch's choice)"
    )


def add_run_group_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--out", required=True, help="run directory (checkpoint, metrics.jsonl, loss.png)")
    add_run_flags(g)
    g.add_argument("--log-every", type=int, default=D.log_every)
    g.add_argument("--save-every", type=int, default=D.save_every)
    g.add_argument("--keep-last", type=int, default=D.keep_last, help="step checkpoints to keep")
    g.add_argument(
        "--stop-after",
        type=int,
        default=D.stop_after,
        help="exit (with a checkpoint) after this many steps of this invocation, as Ctrl-C would; --resume continues",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


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
