"""`python -m train.study`: the whole recipe on this machine, end to end, with honest held-out scores.

tokenizer -> pretraining on unlabelled text -> (optional) a stage on self-supervised cloze questions
(`train.experiments.synth`) -> SQuAD 2.0 fine-tuning -> evaluation on questions the model never trained on,
next to the no-answer baseline of the same questions. Several runs can be compared in one call
(`--runs pretrained,random`: what pretraining buys; `+synth`: what the synthetic stage buys;
`+match`: what the exact-match input feature buys); shared stages run once. Every stage runs the recipe
or library function its command runs, with the settings that command would be given, and is reused
when its output exists, so an interrupted study continues with `--resume`. Seconds per stage are
printed and reported.

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

import dataclasses
import json
import time
from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from qa_core.squad import load_dataset, merge_datasets, read_squad, split_by_article, squad_bytes
from qa_core.tokenizer import XLNetTokenizer
from train.common.cli import Parser
from train.common.sample_data import SAMPLE_DIR as SAMPLE
from train.engine.run_record import MAY_CHANGE, NOT_RECORDED
from train.engine.runlog import read_series
from train.evaluation.options import EvaluationOptions
from train.evaluation.predict import evaluate_checkpoint
from train.experiments import study_flags
from train.experiments.heldout import compare_rules, plot_reliability, predict_files
from train.experiments.runs import given, short_pretraining
from train.experiments.stage_inputs import RECORD, StageInputsChanged, check_stage_inputs
from train.experiments.study_report import (
    comparison_json,
    comparison_section,
    no_answer_baseline,
    plot_study,
    span_quality,
    write_report,
)
from train.experiments.synth import SynthConfig, write_synthetic
from train.recipes.finetune import FinetuneConfig, FinetuneRecipe
from train.recipes.pretrain import PretrainConfig, PretrainRecipe
from train.tokenizer import summary_lines, train_spm

BASES = ("pretrained", "random")
MODIFIERS = ("synth", "match", "plausible", "hard")


def build_parser() -> Parser:
    """The flags (`study_flags`), described by this module's first line."""
    return study_flags.build_parser(__doc__.splitlines()[0] if __doc__ else "")


# training settings that do not change the weights a stage ends with: one invocation's own, and those a
# resumed run may change (the run record's lists: threads, progress, how often it checkpoints or evaluates)
NOT_INPUTS = NOT_RECORDED | MAY_CHANGE


def weights_inputs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A training stage's settings as its inputs: those that make its weights."""
    return {k: v for k, v in settings.items() if k not in NOT_INPUTS}


class Stages:
    """Runs each stage once (skipped when its output exists) and records its seconds. A stage given its
    ``inputs`` records them beside it first (``train.experiments.stage_inputs``): work there made from
    other inputs stops the call instead of being reused."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(
        self,
        name: str,
        done: Path,
        stage: Callable[[], object],
        inputs: Mapping[str, Any] | None = None,
        record: Path | None = None,
        prepare: Callable[[], object] | None = None,
    ) -> None:
        """``record``: where the inputs are kept (default: ``inputs.json`` beside ``done``); a stage
        whose folder holds a checkpoint counts as begun. ``prepare`` writes what the stage reads (its
        data files) once its inputs are accepted, whether it then runs or is reused: a refused call
        leaves them as they were."""
        if inputs is not None:
            where = record or done.parent / RECORD
            begun = done.exists() or (done.parent / "checkpoints").exists()
            check_stage_inputs(where, name, inputs, made=begun, output=done if record else None)
        if prepare is not None:
            prepare()
        if done.exists():
            print(f"[{name}] reusing {done.parent}", flush=True)
            return
        print(f"[{name}] starting", flush=True)
        t = time.time()
        stage()
        if not done.exists():  # a training stage asked to stop (SIGTERM) saves a checkpoint and returns
            print(
                f"[{name}] stopped before it finished ({done.name} not written): run the same command "
                "again to go on from its last checkpoint",
                flush=True,
            )
            raise KeyboardInterrupt  # the pipeline stops here, as interrupted, not with the next stage
        self.seconds[name] = time.time() - t
        print(f"[{name}] done in {self.seconds[name] / 60:.1f} min", flush=True)


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


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or len(set(seeds)) < len(seeds):
        raise ValueError(f"--seeds must name one or more different seeds, got {text!r}")
    return seeds


def _scored_split(args) -> tuple[dict, dict]:
    """(training side, scored articles) of --labelled: --eval-articles by title, else by count. The
    sample's calibration articles are never scored: development (make demo, the tests) fitted on them."""
    labelled = merge_datasets(args.labelled)
    if not args.eval_articles:
        return split_by_article(labelled, args.finetune_articles)
    titles = [t.strip() for t in args.eval_articles.split(",") if t.strip()]
    held, train = split_by_article(labelled, titles)  # ValueError naming an unknown title
    used = sorted(set(titles) & {a["title"] for a in load_dataset(SAMPLE / "calibration.json")["data"]})
    if used:
        raise ValueError(
            f"--eval-articles: {', '.join(used)} are the sample's calibration articles (make demo and the tests "
            "fit on them): score other articles"
        )
    return train, held


def prepare_data(args, out: Path) -> tuple[Path, Path, Path, bool]:
    """Write fit.json (fine-tuning), calibration.json (answerability) and eval.json; returns them and
    whether the calibration articles come from the fine-tuning side."""
    if args.labelled:
        train, held = _scored_split(args)
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
    if isinstance(args.calibration_articles, list):
        calibration, fit = split_by_article(train, args.calibration_articles)
        missing = sorted(set(args.calibration_articles) - {a["title"] for a in calibration["data"]})
        if missing:
            raise ValueError(
                f"--calibration-articles: not among the training-side articles: {', '.join(missing)}"
            )
        if not fit["data"]:
            raise ValueError("--calibration-articles leaves no article to fine-tune on")
        return _write_splits(out, fit, calibration, held, True)
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
    """The three splits' files, unless this --out holds stages made from other splits (each would be
    refused at its stage; refused here first, before the files that describe them change)."""
    paths = out / "fit.json", out / "calibration.json", out / "eval.json"
    documents = [squad_bytes(data) for data in (fit, calibration, held)]
    changed = [p.name for p, d in zip(paths, documents, strict=True) if p.exists() and p.read_bytes() != d]
    if changed and any(out.glob(f"*/{RECORD}")):
        raise StageInputsChanged(
            f"[splits] {out} holds stages made from other articles ({', '.join(changed)} differ: other "
            "--labelled, --eval-articles or --calibration-articles): give another --out, or remove it"
        )
    for path, document in zip(paths, documents, strict=True):
        path.write_bytes(document)
    return *paths, honest


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = parse_runs(args.runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fit, thr, held, honest_threshold = prepare_data(args, out)
    # --resume, --no-progress and --threads of the study pass on to every training stage
    run_flags: dict[str, Any] = {"resume": True} if args.resume else {}
    run_flags |= {"no_progress": True} if args.no_progress else {}
    run_flags |= {"threads": args.threads} if args.threads else {}
    stages = Stages()
    tok = _tokenizer_stage(args, out, fit, stages)
    pre = out / "pretrain"
    if any(r.base == "pretrained" for r in runs):
        _pretraining_stage(args, tok, fit, pre, run_flags, stages)
    synth_files = _synthetic_question_stages(args, runs, out, fit, stages)
    finetune_common = {"dev_file": str(thr), "head": args.head, "batch_size": args.finetune_batch}
    finetune_common |= {"max_seq_len": args.max_seq_len, "doc_stride": args.doc_stride}
    finetune_common |= {"layer_decay": args.layer_decay, **run_flags}
    study = _Study(args, out, stages, tok, pre, synth_files, thr, held, finetune_common)
    held_examples = read_squad(held)
    fit_examples = read_squad(fit)
    comparisons: list = []
    rows = []
    curves: dict[str, list[tuple[int, float]]] = {}
    seeds = parse_seeds(args.seeds)
    for r in runs:
        members = []
        for seed in seeds:
            name = r.name if len(seeds) == 1 else f"{r.name} seed {seed}"
            ft = _finetune(study, r, fit, seed)
            members.append(ft)
            rows.append((name, _evaluate(study, r, ft, held_examples, seed)))
            curves[name] = read_series(ft) if (ft / "metrics.jsonl").exists() else []
            comparisons.append((name, _compare_rules(study, name, [ft], fit_examples, held_examples)))
        if len(members) > 1:
            name = f"{r.name} ensemble of {len(members)} seeds"
            comparisons.append((name, _compare_rules(study, name, members, fit_examples, held_examples)))
    baseline = no_answer_baseline(held_examples)
    pretrained = any(r.base == "pretrained" for r in runs)
    write_report(
        out,
        args,
        rows,
        baseline,
        stages.seconds,
        len(fit_examples),
        held_examples,
        honest_threshold,
        pretrained,
    )
    with open(out / "RESULTS.md", "a") as fh:
        articles = len({ex.title for ex in held_examples})
        fh.write("\n".join(comparison_section(comparisons, honest_threshold, articles)) + "\n")
    (out / "comparison.json").write_text(json.dumps(comparison_json(comparisons), indent=2))
    plot_study(out / "study.png", rows, baseline, curves)
    plot_reliability(out / "reliability.png", comparisons)
    print((out / "RESULTS.md").read_text())
    return 0


def _tokenizer_stage(args, out: Path, fit: Path, stages: Stages) -> Path:
    tok = out / "tokenizer"
    # the fine-tuning articles' text is unlabelled text too
    inputs = [*args.corpus, str(fit)]

    def train_tokenizer() -> None:
        t0 = time.perf_counter()
        model_path = train_spm(inputs, str(tok), args.vocab)
        trained = XLNetTokenizer.from_dir(model_path.parent)
        seconds = time.perf_counter() - t0
        for line in summary_lines(trained, model_path, inputs, args.vocab, True, seconds):
            print(line)

    stages.run("tokenizer", tok / "spiece.model", train_tokenizer, {"text": inputs, "vocab": args.vocab})
    return tok


def _pretraining_stage(
    args, tok: Path, fit: Path, pre: Path, run_flags: dict[str, Any], stages: Stages
) -> None:
    settings = short_pretraining(
        [*args.corpus, str(fit)],
        tok,
        args.config,
        args.pretrain_steps,
        args.pretrain_batch,
        args.seq_len,
        args.pretrain_lr,
        args.max_gram,
    )
    settings |= {"optimizer": args.pretrain_optimizer, "weight_decay": args.pretrain_weight_decay}
    settings |= {"out": str(pre), "save_every": 250, **run_flags}
    config = given(PretrainConfig, **settings)
    stages.run("pretrain", pre / "model.safetensors", PretrainRecipe(config).run, weights_inputs(settings))


def _synthetic_question_stages(
    args, runs: list[Run], out: Path, fit: Path, stages: Stages
) -> dict[bool, Path]:
    """The synthetic questions each +synth run needs: plain, and with hard negatives for +hard."""
    synth_files = {False: out / "synthetic.json", True: out / "synthetic-hard.json"}
    for hard in sorted({r.hard for r in runs if r.synth}):
        cfg = SynthConfig(
            answerable=args.synth_answerable,
            in_place=args.synth_in_place,
            per_sentence=args.synth_per_sentence,
            hard_negatives=args.synth_hard_negatives if hard else 0.0,
        )
        inputs = [*args.corpus, str(fit)]
        stages.run(
            f"synthetic questions{' (hard)' if hard else ''}",
            synth_files[hard],
            partial(write_synthetic, inputs, str(synth_files[hard]), cfg),
            {"text": inputs, "synth": dataclasses.asdict(cfg)},
            record=synth_files[hard].with_name(synth_files[hard].stem + ".inputs.json"),
        )
    return synth_files


@dataclass(frozen=True)
class _Study:
    """What every run's stages share: the options, the shared stages' outputs, the data files."""

    args: Namespace
    out: Path
    stages: Stages
    tok: Path
    pre: Path
    synth_files: dict[bool, Path]
    thr: Path  # calibration.json: fine-tuning's dev file, where the answerability is fitted
    held: Path  # eval.json
    finetune_common: dict[str, Any]

    def finetune_settings(
        self,
        init: dict[str, Any],
        train_file: Path,
        run_dir: Path,
        steps: int,
        lr: float,
        keep: float,
        every: int,
    ) -> dict[str, Any]:
        settings = {**self.finetune_common, **init, "train_file": str(train_file), "out": str(run_dir)}
        settings |= {"steps": steps, "lr": lr, "keep_out_of_window": keep}
        return settings | {"eval_every": every, "save_every": every}


def _seeded(name: str, seed: int) -> str:
    """A stage directory's name for a seed (seed 0 keeps the plain name, so earlier studies resume)."""
    return name if seed == 0 else f"{name}-seed{seed}"


def _finetune(study: _Study, r: Run, fit: Path, seed: int = 0) -> Path:
    """The run's fine-tuning (after its synthetic stage, for +synth); returns its checkpoint."""
    args, out = study.args, study.out
    init: dict[str, Any] = (
        {"init": str(study.pre)} if r.base == "pretrained" else {"config": args.config, "spm": str(study.tok)}
    )
    if r.match:
        init["question_match"] = True
    if r.plausible:
        init["plausible_spans"] = True
    if r.synth:
        stage = out / _seeded(
            "synth-stage-"
            + "-".join([r.base, *(m for m in ("match", "plausible", "hard") if getattr(r, m))]),
            seed,
        )
        settings = study.finetune_settings(
            init,
            study.synth_files[r.hard],
            stage,
            args.synth_steps,
            args.synth_lr,
            args.synth_keep_out_of_window,
            args.synth_steps,
        )
        settings |= {"answerability": "cls", "seed": seed}  # a stage: its successor fits the answerability
        study.stages.run(
            f"synthetic stage ({stage.name})",
            stage / "metadata.json",
            FinetuneRecipe(given(FinetuneConfig, **settings)).run,
            weights_inputs(settings),
        )
        init = {"init": str(stage), **({"plausible_spans": True} if r.plausible else {})}
    ft = out / _seeded(f"finetune-{r.slug}", seed)
    settings = study.finetune_settings(
        init, fit, ft, args.finetune_steps, args.finetune_lr, args.keep_out_of_window, args.eval_every
    )
    settings["seed"] = seed
    config = given(FinetuneConfig, **settings)
    study.stages.run(
        f"fine-tune ({r.name})", ft / "metadata.json", FinetuneRecipe(config).run, weights_inputs(settings)
    )
    return ft


def _evaluate(study: _Study, r: Run, ft: Path, held_examples, seed: int = 0) -> dict:
    """The run's held-out metrics, with the best span's scores beside them."""
    ev = study.out / _seeded(f"eval-{r.slug}", seed)

    def evaluate() -> None:
        options = EvaluationOptions(ft, study.held, ev, progress=not study.args.no_progress)
        result = evaluate_checkpoint(options)
        print(json.dumps(result.metrics, indent=2))

    study.stages.run(
        f"evaluate ({r.name})",
        ev / "metrics.json",
        evaluate,
        {"checkpoint": str(ft), "data": str(study.held)},
    )
    metrics = json.loads((ev / "metrics.json").read_text())
    metrics.update(span_quality(held_examples, json.loads((ev / "nbest.json").read_text())))
    return metrics


def _compare_rules(study: _Study, name: str, members: list[Path], fit_examples, held_examples):
    """Every answerability rule fitted on the calibration questions, scored on the evaluated ones; for
    an ensemble, on the members' averaged logits (its final rule is fitted here, as fine-tuning would)."""
    print(f"[compare answerability rules ({name})] starting", flush=True)
    stored = json.loads((members[0] / "metadata.json").read_text()) if len(members) == 1 else {}
    progress = not study.args.no_progress
    calibration = predict_files(members, read_squad(study.thr), progress=progress)
    evaluated = predict_files(members, held_examples, progress=progress)
    return compare_rules(stored, fit_examples, calibration, evaluated)
