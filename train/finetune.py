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

from train.answerability.fit import ANSWERABILITY_CHOICES, CALIBRATION_METHODS
from train.common.cli import Parser, run
from train.engine.flags import add_shared_flags, add_step_compute_flags
from train.engine.optim import LAYER_DECAY_MODES
from train.engine.run_record import add_run_flags, explicit_flags
from train.model import HEADS
from train.model.config import ANSWER_CLASS_INPUTS
from train.recipes.finetune import FinetuneConfig, FinetuneRecipe
from train.recipes.presets import RECIPES, recipe_defaults

D = FinetuneConfig.defaults()


def build_parser() -> Parser:
    p = Parser(prog="python -m train.finetune", description=__doc__.splitlines()[0])
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        help="the original XLNet's published SQuAD 2.0 settings (train/recipes/presets.py); explicit flags win",
    )
    add_data_flags(p.add_argument_group("data"))
    add_model_flags(p.add_argument_group("model"))
    add_optimisation_flags(p.add_argument_group("optimisation"))
    add_evaluation_and_run_flags(p.add_argument_group("evaluation and run"))
    return p


def add_data_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--train-file", help="SQuAD 2.0 JSON (e.g. train-v2.0.json); required unless --resume restores it"
    )
    g.add_argument(
        "--dev-file",
        help="SQuAD 2.0 JSON with answers (e.g. dev-v2.0.json); required unless --resume restores it",
    )
    g.add_argument(
        "--max-seq-len", type=int, default=D.max_seq_len, help="window length in tokens (512 allowed)"
    )
    g.add_argument(
        "--doc-stride", type=int, default=D.doc_stride, help="stride between windows of long paragraphs"
    )
    g.add_argument("--max-query-len", type=int, default=D.max_query_len, help="question tokens kept")
    g.add_argument(
        "--keep-out-of-window",
        type=float,
        default=D.keep_out_of_window,
        help="share of training windows kept whose answerable question's answer is outside the window "
        "(1 = all, as the original)",
    )
    g.add_argument(
        "--plausible-spans",
        action="store_true",
        help="train the span head on unanswerable questions' plausible answers too (their answerability "
        "label stays unanswerable; Read+Verify's auxiliary span targets)",
    )
    g.add_argument(
        "--max-dev-examples",
        type=int,
        default=D.max_dev_examples,
        help="evaluate on the first N dev questions only",
    )


def add_model_flags(g: argparse._ArgumentGroup) -> None:
    add_shared_flags(
        g,
        D,
        init="our pretraining/fine-tuned checkpoint or a HuggingFace XLNet directory",
        config="random init of this preset (needs --spm/--train-spm)",
        spm="sentencepiece model (file or directory) for random init",
        train_spm="train a sentencepiece model on the data",
    )
    g.add_argument("--head", choices=HEADS, default=D.head, help="QA head")
    g.add_argument(
        "--start-n-top", type=int, default=D.start_n_top, help="beam head: start candidates (config)"
    )
    g.add_argument(
        "--end-n-top", type=int, default=D.end_n_top, help="beam head: end candidates per start (config)"
    )
    g.add_argument(
        "--answer-class-input",
        choices=ANSWER_CLASS_INPUTS,
        default=D.answer_class_input,
        help="beam head answerability input in training: softmax_start (original; the default of a "
        "new model) or gold_start (HF); default: keep the checkpoint's",
    )
    add_shared_flags(
        g, D, activation="activation for random init", aoa="Attention-on-Attention (random init only)"
    )
    g.add_argument(
        "--question-match",
        action="store_true",
        help="add the DrQA exact-match feature: a learned embedding on tokens that occur on both sides "
        "of <sep> (our extension; zero at the start, so a checkpoint without it begins unchanged)",
    )
    add_shared_flags(g, D, dropout="override dropout")
    g.add_argument(
        "--freeze-layers", type=int, default=D.freeze_layers, help="freeze the bottom N transformer layers"
    )
    g.add_argument("--freeze-embeddings", action="store_true", help="freeze the word embedding")


def add_optimisation_flags(g: argparse._ArgumentGroup) -> None:
    add_shared_flags(g, D, steps="optimizer steps (overrides --epochs)")
    g.add_argument("--epochs", type=float, default=D.epochs, help="passes over the training features")
    add_shared_flags(g, D, batch_size="features per micro-batch per rank")
    g.add_argument(
        "--global-batch-size",
        type=int,
        default=D.global_batch_size,
        help="windows per optimizer step over all ranks and accumulation (sets --batch-size)",
    )
    add_shared_flags(
        g,
        D,
        grad_accum="micro-batches per step (default 1; recipes: devices/ranks)",
        lr="peak learning rate of the top layer/head",
    )
    g.add_argument(
        "--layer-decay",
        type=float,
        default=D.layer_decay,
        help="layer-wise decay rate (1 = off; original 0.75)",
    )
    g.add_argument(
        "--layer-decay-on",
        choices=LAYER_DECAY_MODES,
        default=D.layer_decay_on,
        help="gradients: layer l's clipped gradients x rate^(n_layer-1-l) (original); "
        "learning-rate: lr x rate^(depth from the top), embeddings lowest (much stronger)",
    )
    add_shared_flags(
        g,
        D,
        optimizer="xlnet (original) or adamw",
        warmup="warmup steps (default 10%% of the steps)",
        decay=None,
        min_lr_ratio="final lr as a fraction of the peak",
        weight_decay="original SQuAD runs: 0",
        adam_eps=None,
        clip="gradient global-norm clip (0 = off)",
    )
    g.add_argument(
        "--clip-each-micro-batch",
        action="store_true",
        help="clip each micro-batch's (and rank's) gradient before summing, as the original per TPU core",
    )
    add_step_compute_flags(g, D.precision)
    add_shared_flags(g, D, device=None, seed=None, threads=None)


def add_evaluation_and_run_flags(g: argparse._ArgumentGroup) -> None:
    add_shared_flags(g, D, out="run directory; holds the final model")
    g.add_argument(
        "--keep-best",
        action="store_true",
        help="also keep the checkpoint with the highest dev best_f1 in OUT/best (selected on the dev file)",
    )
    g.add_argument(
        "--eval-every", type=int, default=D.eval_every, help="evaluate on the dev file every N steps"
    )
    g.add_argument("--eval-batch-size", type=int, default=D.eval_batch_size)
    g.add_argument(
        "--answerability",
        choices=ANSWERABILITY_CHOICES,
        default=D.answerability,
        help="how the final model decides to answer: a question verifier fitted on the training questions, "
        "alone (verifier-only) or combined with the model's scores (verifier), calibrated and given a decision "
        "rule by cross-fitting over the dev file's articles; auto keeps whichever cross-validates better; "
        "model-scores; or cls (a threshold on sigmoid(cls_logit), as before)",
    )
    g.add_argument(
        "--calibration",
        choices=CALIBRATION_METHODS,
        default=D.calibration,
        help="calibration of P(answerable) for verifier / model-scores",
    )
    g.add_argument(
        "--no-rerank",
        dest="rerank",
        action="store_false",
        help="keep the reader's own span order: fit no span re-ranker on the dev file (one is fitted with "
        "every answerability but cls, and the rule is fitted on the re-ranked spans)",
    )
    g.add_argument("--n-best", type=int, default=D.n_best, help="candidate spans kept per question")
    g.add_argument("--max-answer-len", type=int, default=D.max_answer_len, help="longest answer in tokens")
    add_shared_flags(g, D, log_every=None, save_every=None, keep_last=None)
    add_run_flags(g)
    add_shared_flags(
        g,
        D,
        stop_after="exit with a checkpoint after N steps of this invocation, as Ctrl-C would; --resume continues",
        no_progress=None,
    )


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
