"""`python -m train.finetune`: SQuAD 2.0 fine-tuning (answer span + answerability), original XLNet recipe.

Thin CLI over `finetune(args)`: features `P <sep> Q <sep> <cls>` with windows and max-context
(`train.squad`), one of the heads shallow / deep / beam / simple, layer freezing, the original's
optimiser (`train.engine.optim`: TF-style Adam, clipping, layer-wise decay of the clipped gradients),
evaluation every N steps with the official metrics. `--out` receives the FINAL model and its dev
metrics (its metadata carries the no-answer threshold that export and serving use by default);
`--keep-best` also keeps the checkpoint with the highest dev best_f1 in `--out/best`, labelled with
the data it was selected on. `--recipe` sets the original's published-run settings in one flag.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from train.common.cli import Parser, run
from train.common.contract import DEFAULTS
from train.engine.loop import LoopPlan, StepReport, run_loop
from train.engine.optim import (
    DECAYS,
    LAYER_DECAY_MODES,
    OPTIMIZERS,
    make_optimizer,
    make_scheduler,
)
from train.engine.predict import evaluate_predictions, redecide, run_evaluation, write_prediction_files
from train.engine.run_record import add_run_flags, explicit_flags, open_run
from train.engine.runlog import MetricsLog
from train.engine.runtime import init_distributed, seed_everything
from train.engine.state import latest_checkpoint, load_training_state, save_training_state
from train.engine.step import TrainStep
from train.model import ACTIVATIONS, HEADS, PRESETS, XLNetConfig, XLNetForQuestionAnswering, checkpoint
from train.model.config import ANSWER_CLASS_INPUTS
from train.recipes.answerability import ANSWERABILITY_CHOICES, CALIBRATION_METHODS, fit_for
from train.recipes.presets import RECIPES, recipe_defaults
from train.squad import (
    Answerability,
    featurize,
    pad_batch,
    read_squad,
    subsample_out_of_window,
)
from train.tokenizer import XLNetTokenizer, train_spm


def build_parser() -> Parser:
    p = Parser(prog="python -m train.finetune", description=__doc__.splitlines()[0])
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        help="the original XLNet's published SQuAD 2.0 settings (train/recipes/presets.py); explicit flags win",
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--train-file", help="SQuAD 2.0 JSON (e.g. train-v2.0.json); required unless --resume restores it"
    )
    g.add_argument(
        "--dev-file",
        help="SQuAD 2.0 JSON with answers (e.g. dev-v2.0.json); required unless --resume restores it",
    )
    g.add_argument(
        "--max-seq-len", type=int, default=DEFAULTS.max_seq_len, help="window length in tokens (512 allowed)"
    )
    g.add_argument(
        "--doc-stride",
        type=int,
        default=DEFAULTS.doc_stride,
        help="stride between windows of long paragraphs",
    )
    g.add_argument("--max-query-len", type=int, default=DEFAULTS.max_query_len, help="question tokens kept")
    g.add_argument(
        "--keep-out-of-window",
        type=float,
        default=1.0,
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
        "--max-dev-examples", type=int, default=None, help="evaluate on the first N dev questions only"
    )
    g = p.add_argument_group("model")
    g.add_argument("--init", help="our pretraining/fine-tuned checkpoint or a HuggingFace XLNet directory")
    g.add_argument(
        "--config", choices=sorted(PRESETS), help="random init of this preset (needs --spm/--train-spm)"
    )
    g.add_argument("--spm", help="sentencepiece model (file or directory) for random init")
    g.add_argument(
        "--train-spm", type=int, metavar="VOCAB_SIZE", help="train a sentencepiece model on the data"
    )
    g.add_argument("--head", choices=HEADS, default="shallow", help="QA head")
    g.add_argument("--start-n-top", type=int, default=None, help="beam head: start candidates (config)")
    g.add_argument("--end-n-top", type=int, default=None, help="beam head: end candidates per start (config)")
    g.add_argument(
        "--answer-class-input",
        choices=ANSWER_CLASS_INPUTS,
        default=None,
        help="beam head answerability input in training: softmax_start (original; the default of a "
        "new model) or gold_start (HF); default: keep the checkpoint's",
    )
    g.add_argument("--activation", choices=ACTIVATIONS, default=None, help="activation for random init")
    g.add_argument("--aoa", action="store_true", help="Attention-on-Attention (random init only)")
    g.add_argument(
        "--question-match",
        action="store_true",
        help="add the DrQA exact-match feature: a learned embedding on tokens that occur on both sides "
        "of <sep> (our extension; zero at the start, so a checkpoint without it begins unchanged)",
    )
    g.add_argument("--dropout", type=float, default=None, help="override dropout")
    g.add_argument("--freeze-layers", type=int, default=0, help="freeze the bottom N transformer layers")
    g.add_argument("--freeze-embeddings", action="store_true", help="freeze the word embedding")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    g.add_argument("--epochs", type=float, default=2.0, help="passes over the training features")
    g.add_argument("--batch-size", type=int, default=8, help="features per micro-batch per rank")
    g.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="windows per optimizer step over all ranks and accumulation (sets --batch-size)",
    )
    g.add_argument(
        "--grad-accum",
        type=int,
        default=None,
        help="micro-batches per step (default 1; recipes: devices/ranks)",
    )
    g.add_argument("--lr", type=float, default=3e-5, help="peak learning rate of the top layer/head")
    g.add_argument(
        "--layer-decay", type=float, default=0.75, help="layer-wise decay rate (1 = off; original 0.75)"
    )
    g.add_argument(
        "--layer-decay-on",
        choices=LAYER_DECAY_MODES,
        default="gradients",
        help="gradients: layer l's clipped gradients x rate^(n_layer-1-l) (original); "
        "learning-rate: lr x rate^(depth from the top), embeddings lowest (much stronger)",
    )
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="xlnet", help="xlnet (original) or adamw")
    g.add_argument("--warmup", type=int, default=None, help="warmup steps (default 10%% of the steps)")
    g.add_argument("--decay", choices=DECAYS, default="linear")
    g.add_argument("--min-lr-ratio", type=float, default=0.0, help="final lr as a fraction of the peak")
    g.add_argument("--weight-decay", type=float, default=0.0, help="original SQuAD runs: 0")
    g.add_argument("--adam-eps", type=float, default=1e-6)
    g.add_argument("--clip", type=float, default=1.0, help="gradient global-norm clip (0 = off)")
    g.add_argument(
        "--clip-each-micro-batch",
        action="store_true",
        help="clip each micro-batch's (and rank's) gradient before summing, as the original per TPU core",
    )
    g.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    g.add_argument("--device", default="auto")
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--threads", type=int, default=None)
    g = p.add_argument_group("evaluation and run")
    g.add_argument("--out", required=True, help="run directory; holds the final model")
    g.add_argument(
        "--keep-best",
        action="store_true",
        help="also keep the checkpoint with the highest dev best_f1 in OUT/best (selected on the dev file)",
    )
    g.add_argument("--eval-every", type=int, default=500, help="evaluate on the dev file every N steps")
    g.add_argument("--eval-batch-size", type=int, default=32)
    g.add_argument(
        "--answerability",
        choices=ANSWERABILITY_CHOICES,
        default="auto",
        help="how the final model decides to answer: a question verifier fitted on the training questions, "
        "alone (verifier-only) or combined with the model's scores (verifier), calibrated and given a decision "
        "rule by cross-fitting over the dev file's articles; auto keeps whichever cross-validates better; "
        "model-scores; or cls (a threshold on sigmoid(cls_logit), as before)",
    )
    g.add_argument(
        "--calibration",
        choices=CALIBRATION_METHODS,
        default="platt",
        help="calibration of P(answerable) for verifier / model-scores",
    )
    g.add_argument("--n-best", type=int, default=DEFAULTS.n_best, help="candidate spans kept per question")
    g.add_argument(
        "--max-answer-len", type=int, default=DEFAULTS.max_answer_len, help="longest answer in tokens"
    )
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--save-every", type=int, default=500)
    g.add_argument("--keep-last", type=int, default=2)
    add_run_flags(g)
    g.add_argument(
        "--stop-after", type=int, default=None, help="exit with a checkpoint after N steps (tests)"
    )
    g.add_argument("--no-progress", action="store_true")
    return p


def load_tokenizer_and_model(args, out: Path):
    """--init PATH (backbone, and head if it matches) or a random --config model with its tokenizer."""
    overrides = config_overrides(args)
    if args.init:
        loaded = checkpoint.load(args.init, head=args.head, config_overrides=overrides)
        tokenizer = loaded.tokenizer
        if args.spm:
            tokenizer = _spm(args.spm)
        if tokenizer is None:
            raise ValueError(f"{args.init} has no spiece.model; pass --spm")
        if tokenizer.vocab_size > loaded.config.vocab_size:
            raise ValueError(
                f"tokenizer vocab {tokenizer.vocab_size} > model vocab {loaded.config.vocab_size}"
            )
        return tokenizer, loaded.model, loaded.metadata
    if not args.config:
        raise ValueError("give --init PATH, or --config PRESET with --spm or --train-spm")
    if args.spm:
        tokenizer = _spm(args.spm)
    else:
        tok_dir = out / "tokenizer"
        if not (tok_dir / "spiece.model").exists():
            train_spm([args.train_file, args.dev_file], tok_dir, args.train_spm or 8000)
        tokenizer = XLNetTokenizer.from_dir(tok_dir)
    config = XLNetConfig.preset(
        args.config,
        vocab_size=tokenizer.vocab_size,
        ff_activation=args.activation,
        use_aoa=args.aoa or None,
        **config_overrides(args),
    )
    return tokenizer, XLNetForQuestionAnswering(config, head=args.head), {}


def config_overrides(args) -> dict:
    """Model-config fields that fine-tuning flags set (None = keep the checkpoint's or preset's)."""
    fields = {
        "dropout": args.dropout,
        "start_n_top": args.start_n_top,
        "end_n_top": args.end_n_top,
        "answer_class_input": args.answer_class_input,
        "question_match": True if args.question_match else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _spm(path: str) -> XLNetTokenizer:
    p = Path(path)
    return XLNetTokenizer.from_dir(p) if p.is_dir() else XLNetTokenizer(p)


def freeze(model: XLNetForQuestionAnswering, n_layers: int, embeddings: bool) -> int:
    """Freeze the word embedding and/or the bottom N layers; returns the trainable parameter count."""
    if n_layers > model.config.n_layer:
        raise ValueError(f"--freeze-layers {n_layers} > n_layer {model.config.n_layer}")
    model.transformer.mask_emb.requires_grad_(False)  # query stream only: unused by QA
    if embeddings:
        model.transformer.word_embedding.weight.requires_grad_(False)
    for layer in model.transformer.layer[:n_layers]:
        for p in layer.parameters():
            p.requires_grad_(False)
    if not model.config.untie_r and 0 < n_layers < model.config.n_layer:
        for name in ("r_w_bias", "r_r_bias", "r_s_bias"):  # shared by all layers: keep them trainable
            getattr(model.transformer.layer[0].rel_attn, name).requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class FeatureBatches:
    """Shuffled epochs over training features, resumable (epoch, position, RNG state)."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world: int = 1) -> None:
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world
        self.rng = np.random.default_rng(seed)
        self.epoch, self.pos = 0, 0
        self.order = self.rng.permutation(n)

    def next_indices(self) -> list[int]:
        span = self.batch_size * self.world
        if self.pos + span > self.n:
            self.epoch += 1
            self.pos = 0
            self.order = self.rng.permutation(self.n)
        chunk = self.order[self.pos : self.pos + span]
        self.pos += span
        return chunk[self.rank :: self.world].tolist()

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "order": self.order,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])
        self.order = np.asarray(s["order"])
        self.rng.bit_generator.state = s["rng"]


def finetune(args) -> dict:
    d = init_distributed(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    args = open_run(out, "finetune", args, d, validate=check_data_files)
    seed_everything(args.seed)
    tokenizer, model, init_meta = load_tokenizer_and_model(args, out)
    model.to(d.device)
    trainable = freeze(model, args.freeze_layers, args.freeze_embeddings)
    train_examples = read_squad(args.train_file)
    dev_examples = read_squad(args.dev_file)
    if args.max_dev_examples:
        dev_examples = dev_examples[: args.max_dev_examples]
    fkw = {
        "max_seq_len": args.max_seq_len,
        "doc_stride": args.doc_stride,
        "max_query_len": args.max_query_len,
    }
    train_features = featurize(
        train_examples, tokenizer, is_training=True, plausible_spans=args.plausible_spans, **fkw
    )
    train_features = subsample_out_of_window(
        train_features, train_examples, args.keep_out_of_window, args.seed
    )
    dev_features = featurize(dev_examples, tokenizer, **fkw)
    if not train_features:
        raise ValueError(f"{args.train_file}: no training features")
    args.grad_accum = resolve_grad_accum(args, d.world_size)
    batch_size = micro_batch_size(args, d.world_size)
    per_epoch = max(1, len(train_features) // (batch_size * d.world_size * args.grad_accum))
    total_steps = args.steps if args.steps is not None else max(1, math.ceil(args.epochs * per_epoch))
    warmup = args.warmup if args.warmup is not None else int(0.1 * total_steps)
    optimizer = make_optimizer(
        model,
        lr=args.lr,
        weight_decay=args.weight_decay,
        layer_decay=args.layer_decay,
        layer_decay_mode=args.layer_decay_on,
        optimizer=args.optimizer,
        eps=args.adam_eps,
    )
    scheduler = make_scheduler(optimizer, total_steps, warmup, args.decay, args.min_lr_ratio)
    batches = FeatureBatches(len(train_features), batch_size, args.seed, d.rank, d.world_size)
    step, best_f1, best_step = 0, -1.0, None
    final_metrics: dict | None = None
    resume_from = latest_checkpoint(out) if args.resume else None
    if resume_from is not None:
        state = load_training_state(resume_from, model, optimizer, scheduler)
        step = state["step"]
        batches.load_state_dict(state["data"])
        best_f1 = state["extra"].get("best_f1", -1.0)
        best_step = state["extra"].get("best_step")
        if d.is_main:
            print(f"Resumed from {resume_from} at step {step} (best_f1 so far {best_f1:.2f})", flush=True)
        if step >= total_steps and (out / "metadata.json").exists():  # already finished: report it again
            final_metrics = json.loads((out / "metadata.json").read_text()).get("dev_metrics")
    trainer = TrainStep.from_args(model, optimizer, scheduler, d, args, state if resume_from else None)
    log = MetricsLog(
        out,
        enabled=d.is_main,
        resume_step=step,
        plots={"loss.png": ["loss"], "dev_f1.png": ["dev_f1", "dev_best_f1", "dev_exact"]},
    )
    if d.is_main:
        n_imp = sum(f.is_impossible for f in train_features)
        recipe = f"recipe {args.recipe}, " if args.recipe else ""
        print(
            f"Fine-tuning head={args.head} ({trainable / 1e6:.2f}M trainable params) on {len(train_examples)} "
            f"questions -> {len(train_features)} features ({n_imp} no-answer); dev {len(dev_examples)} questions; "
            f"{recipe}{total_steps} steps of {batch_size * d.world_size * args.grad_accum} windows, "
            f"warmup {warmup}, lr {args.lr:g}, layer decay {args.layer_decay:g} on {args.layer_decay_on}",
            flush=True,
        )
    bar = tqdm(total=total_steps, initial=step, disable=not d.is_main or args.no_progress, dynamic_ncols=True)
    last_loss, t0, seen = float("nan"), time.time(), 0

    def run_info(
        metrics: dict, threshold: float, at_step: int, answerability: Answerability | None = None
    ) -> dict:
        return {
            "stage": "finetune",
            "step": at_step,
            "head": args.head,
            "recipe": args.recipe,
            "no_answer_threshold": threshold,
            "threshold_selected_on": str(args.dev_file),
            "answerability": answerability.to_dict() if answerability is not None else None,
            "max_seq_len": args.max_seq_len,
            "doc_stride": args.doc_stride,
            "max_query_len": args.max_query_len,
            "max_answer_len": args.max_answer_len,
            "n_best": args.n_best,
            "dev_metrics": metrics,
            "dev_file": str(args.dev_file),
            "init": str(args.init) if args.init else None,
            "init_metadata_stage": init_meta.get("stage"),
        }

    def evaluate_on_dev(at_step: int, final: bool) -> dict:
        """Dev metrics of the current weights; the final model always goes to --out, the best to --out/best."""
        nonlocal best_f1, best_step
        result = run_evaluation(
            model,
            dev_examples,
            dev_features,
            batch_size=args.eval_batch_size,
            device=d.device,
            n_best=args.n_best,
            max_answer_len=args.max_answer_len,
        )
        # The cls-only threshold: where dev best_f1 is reached (as the original's threshold search); re-score at it.
        thr = min(max(float(result.metrics.get("best_f1_thresh", 0.5)), 0.0), 1.0)
        result.predictions = redecide(dev_examples, result.predictions, Answerability.cls_only(thr))
        m = evaluate_predictions(dev_examples, result.predictions)
        result.metrics = m
        log.log(at_step, dev_exact=m["exact"], dev_f1=m["f1"], dev_best_f1=m["best_f1"], dev_threshold=thr)
        log.plot()
        if m["best_f1"] > best_f1:
            best_f1, best_step = m["best_f1"], at_step
            if args.keep_best:
                meta = run_info(m, thr, at_step) | {
                    "selected_on": str(args.dev_file),
                    "selection": "highest dev best_f1 over the evaluations; its dev metrics are optimistic",
                }
                checkpoint.save(model, out / "best", tokenizer=tokenizer, metadata=meta)
                write_prediction_files(out / "best" / "dev_predictions", result)
        if final:
            answerability = fit_final_answerability(args, train_examples, dev_examples, result.predictions)
            meta = run_info(m, thr, at_step, answerability)
            checkpoint.save_into(model, out, tokenizer=tokenizer, metadata=meta)
            write_prediction_files(out / "dev_predictions", result)
        return m

    def micro_loss(train_model: torch.nn.Module, _: int) -> torch.Tensor:
        nonlocal seen
        idx = batches.next_indices()
        arrays = pad_batch([train_features[i] for i in idx], include_labels=True)
        t = {k: torch.from_numpy(v).to(d.device) for k, v in arrays.items()}
        seen += len(idx)
        return train_model(
            t["input_ids"],
            token_type_ids=t["token_type_ids"],
            attention_mask=t["attention_mask"],
            p_mask=t["p_mask"],
            cls_index=t["cls_index"],
            start_positions=t["start_positions"],
            end_positions=t["end_positions"],
            is_impossible=t["is_impossible"],
        ).loss

    def after_step(r: StepReport) -> None:
        nonlocal t0, seen, last_loss, final_metrics
        last_loss = r.loss
        if r.step % args.log_every == 0 or r.step == total_steps:
            elapsed = time.time() - t0
            log.log(
                r.step,
                loss=r.loss,
                lr=scheduler.get_last_lr()[0],
                grad_norm=r.outcome.grad_norm,
                epoch=batches.epoch,
                features_per_s=seen / max(elapsed, 1e-9),
                s_per_step=elapsed / max(1, args.log_every),
                skipped_steps=trainer.skipped_total,
            )
            bar.set_postfix(loss=f"{r.loss:.3f}", best_f1=f"{best_f1:.1f}")
            t0, seen = time.time(), 0
        bar.update(1)
        if d.is_main and (r.step % args.eval_every == 0 or r.step == total_steps):
            m = evaluate_on_dev(r.step, final=r.step == total_steps)
            if r.step == total_steps:
                final_metrics = m
            bar.write(f"step {r.step}: dev EM {m['exact']:.2f} F1 {m['f1']:.2f} best_f1 {m['best_f1']:.2f}")

    def save(at_step: int) -> None:
        if d.is_main:
            save_training_state(
                out,
                at_step,
                model,
                optimizer,
                scheduler,
                tokenizer=tokenizer,
                data_state=batches.state_dict(),
                keep_last=args.keep_last,
                extra={"best_f1": best_f1, "best_step": best_step, "trainer": trainer.state_dict()},
                metadata={"stage": "finetune-state", "head": args.head},
            )
            log.plot()  # at saves, evaluations and the end, not every log step
        if d.enabled:
            dist.barrier()  # no rank runs ahead of a checkpoint rank 0 is writing

    plan = LoopPlan(step, total_steps, args.save_every, args.stop_after)
    step = run_loop(trainer, micro_loss, plan, d, after_step=after_step, save=save)
    bar.close()
    log.close()
    if d.is_main and final_metrics is not None:
        m = final_metrics
        best = f"; the best of the evaluations (selected on {args.dev_file}) is in {out / 'best'}"
        print(
            f"Done: {step} steps, final loss {last_loss:.4f}. Final model in {out}: dev EM {m['exact']:.2f} "
            f"F1 {m['f1']:.2f} at no-answer threshold {m['threshold']:.3f} (chosen on {args.dev_file}); "
            f"best_exact {m['best_exact']:.2f} best_f1 {m['best_f1']:.2f} (threshold tuned on the same questions, "
            f"as the original reports){best if args.keep_best else ''}",
            flush=True,
        )
    if d.enabled:
        dist.destroy_process_group()
    return {
        "step": step,
        "loss": last_loss,
        "final_metrics": final_metrics,
        "best_f1": best_f1,  # the highest dev best_f1 over the evaluations (a selection on dev)
        "best_step": best_step,
        "trainable_params": trainable,
    }


def fit_final_answerability(args, train_examples, dev_examples, predictions) -> Answerability | None:
    """The final model's answerability (None: cls only): the question verifier fitted on the
    fine-tuning questions (it reads no model output), the rest cross-fitted on the dev file's articles."""
    if args.answerability == "cls":
        return None
    try:
        a = fit_for(args.answerability, train_examples, dev_examples, predictions, args.calibration)
    except ValueError as exc:  # one paragraph's worth of questions, or a single class: nothing to fit
        print(f"answerability: not fitted ({exc}); the final model decides by sigmoid(cls_logit)", flush=True)
        return None
    print(
        f"answerability ({args.answerability}, fitted on {args.dev_file}): {a.report['decision']}", flush=True
    )
    return a


def micro_batch_size(args, world_size: int) -> int:
    """--batch-size, or --global-batch-size split over ranks and accumulation steps."""
    if args.global_batch_size is None:
        return args.batch_size
    grad_accum = resolve_grad_accum(args, world_size)
    per_step = world_size * grad_accum
    if args.global_batch_size % per_step:
        raise ValueError(
            f"--global-batch-size {args.global_batch_size} is not divisible by ranks x --grad-accum "
            f"({world_size} x {grad_accum}); choose --grad-accum so that it is (with a recipe: "
            f"ranks x --grad-accum = the original's number of devices keeps its per-device clipping)"
        )
    return args.global_batch_size // per_step


def parse_args(argv: Sequence[str] | None = None):
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


def resolve_grad_accum(args, world_size: int) -> int:
    """--grad-accum, else for a recipe the original's devices / ranks (one micro-batch per device)."""
    if args.grad_accum is not None:
        if args.grad_accum < 1:
            raise ValueError(f"--grad-accum must be at least 1, got {args.grad_accum}")
        return args.grad_accum
    if not args.recipe:
        return 1  # no recipe to reproduce: one micro-batch per rank and step
    devices = RECIPES[args.recipe]["devices"]
    if devices % world_size:
        raise ValueError(
            f"recipe {args.recipe} ran on {devices} devices, each clipping its own gradient; {world_size} ranks "
            f"cannot split that: run on a divisor of {devices} ranks, or give --grad-accum"
        )
    return max(1, devices // world_size)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.spm and args.train_spm:
        raise ValueError("give either --spm or --train-spm, not both")
    finetune(args)  # checks the data files once the settings to run with are known (--resume restores)
    return 0


def check_data_files(args) -> None:
    """--train-file and --dev-file given and present (one clear line otherwise)."""
    for flag, f in (("--train-file", args.train_file), ("--dev-file", args.dev_file)):
        if f is None:
            raise ValueError(f"{flag} is required (unless --resume continues a run that recorded it)")
        if not Path(f).exists():
            raise FileNotFoundError(f"data file not found: {f}")


if __name__ == "__main__":
    sys.exit(run(main, prog="train.finetune"))
