"""`python -m train.study`'s flags, by group: data, runs, pretraining, the synthetic stage, fine-tuning."""

from __future__ import annotations

from argparse import _ArgumentGroup

from train.common.cli import Parser
from train.common.dataclass_flags import add_flags
from train.common.sample_data import SAMPLE_DIR as SAMPLE
from train.experiments.synth import SynthConfig
from train.recipes.finetune_config import FinetuneConfig
from train.recipes.pretrain_config import PretrainConfig


def short_batch_flag(stage: str) -> dict[str, str]:
    """A stage's batch flag keeps its short spelling: ``--pretrain-batch``, ``--finetune-batch``."""
    return {"batch_size": f"--{stage}-batch"}


def article_count_or_titles(text: str) -> int | list[str]:
    """``--calibration-articles``: a count, or comma-separated titles."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    titles = [t.strip() for t in text.split(",") if t.strip()]
    if not titles:
        raise ValueError("--calibration-articles: give a count or comma-separated titles")
    return titles


def build_parser(description: str) -> Parser:
    p = Parser(prog="python -m train.study", description=description)
    _data_arguments(p.add_argument_group("data"))
    _run_arguments(p.add_argument_group("runs"))
    _pretraining_arguments(p.add_argument_group("pretraining"))
    _synth_arguments(p.add_argument_group("synthetic-question stage (runs named ...+synth)"))
    _finetuning_arguments(p.add_argument_group("fine-tuning"))
    add_flags(p, FinetuneConfig, ("out", "resume", "no_progress"), {"out": "runs/study"})
    return p


def _data_arguments(g: _ArgumentGroup) -> None:
    g.add_argument("--train-file", default=str(SAMPLE / "train.json"), help="SQuAD 2.0 file to fine-tune on")
    g.add_argument("--eval-file", default=str(SAMPLE / "dev.json"), help="SQuAD 2.0 file to evaluate on")
    g.add_argument(
        "--labelled",
        nargs="+",
        help="instead: SQuAD 2.0 files (their articles together) split by article into train and eval",
    )
    g.add_argument("--finetune-articles", type=int, default=9, help="with --labelled: articles to train on")
    g.add_argument(
        "--eval-articles",
        help="with --labelled: comma-separated titles to score, instead of the articles after "
        "--finetune-articles (never the sample's calibration articles: make demo and the tests fit on them)",
    )
    g.add_argument(
        "--calibration-articles",
        "--threshold-articles",
        dest="calibration_articles",
        type=article_count_or_titles,
        default=None,
        help="fine-tuning-side articles held out of fine-tuning, where the answerability model (combination, "
        "calibration, threshold, rule) is fitted by cross-fitting: a count (the last ones) or comma-separated "
        "titles (default 2 with --labelled; 0: on the eval file itself, optimistic)",
    )
    g.add_argument(
        "--calibration-file",
        help="with --train-file: articles held out of fine-tuning to fit the answerability on (default: the "
        "sample's calibration.json with the sample's files, else --calibration-articles of --train-file)",
    )
    g.add_argument(
        "--corpus", nargs="+", default=[str(SAMPLE / "corpus.json")], help="unlabelled pretraining text"
    )


def _run_arguments(g: _ArgumentGroup) -> None:
    g.add_argument(
        "--runs",
        default="pretrained,random",
        help="comma-separated: pretrained | random, each optionally +synth (e.g. pretrained+synth)",
    )
    g.add_argument(
        "--seeds",
        default="0",
        help="comma-separated seeds of every run's synthetic stage and fine-tuning; with several, each seed "
        "is scored and so is their ensemble (logits averaged)",
    )
    add_flags(g, PretrainConfig, ("config",))
    g.add_argument(
        "--vocab", type=int, default=4000, help="the tokenizer's vocabulary, trained on the corpus"
    )
    add_flags(g, FinetuneConfig, ("head", "threads"))


def _pretraining_arguments(g: _ArgumentGroup) -> None:
    # pretraining's own flags under --pretrain-..., with the study's defaults
    defaults = {"steps": 1000, "batch_size": 16, "lr": 1e-3}
    add_flags(
        g,
        PretrainConfig,
        ("steps", "batch_size", "lr"),
        defaults,
        prefix="pretrain",
        spell=short_batch_flag("pretrain"),
    )
    add_flags(g, PretrainConfig, ("seq_len", "max_gram"), {"max_gram": 1})
    add_flags(g, PretrainConfig, ("optimizer", "weight_decay"), prefix="pretrain")


def _synth_arguments(g: _ArgumentGroup) -> None:
    # a fine-tuning run on questions SynthConfig makes: their flags under --synth-...
    add_flags(g, FinetuneConfig, ("steps", "lr"), {"steps": 1000, "lr": 5e-4}, prefix="synth")
    add_flags(g, SynthConfig, ("answerable", "in_place", "per_sentence"), prefix="synth")
    add_flags(g, FinetuneConfig, ("keep_out_of_window",), prefix="synth")
    g.add_argument(
        "--synth-hard-negatives",
        type=float,
        default=0.5,
        help="runs named ...+hard: share of unanswerable synthetic questions made by an edit",
    )


def _finetuning_arguments(g: _ArgumentGroup) -> None:
    defaults = {"steps": 1500, "batch_size": 16, "lr": 5e-4}
    add_flags(
        g,
        FinetuneConfig,
        ("steps", "batch_size", "lr"),
        defaults,
        prefix="finetune",
        spell=short_batch_flag("finetune"),
    )
    # fine-tuning's own flags, with the study's defaults
    defaults = {"layer_decay": 0.9, "max_seq_len": 192, "doc_stride": 128}
    add_flags(
        g,
        FinetuneConfig,
        ("layer_decay", "max_seq_len", "doc_stride", "eval_every", "keep_out_of_window"),
        defaults,
    )
