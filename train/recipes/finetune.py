"""Fine-tuning as a recipe: SQuAD 2.0 (answer span + answerability), the original XLNet recipe.

:class:`FinetuneConfig` holds every setting (one field per ``python -m train.finetune`` flag, with its
default); :class:`FinetuneRecipe` runs it in stages: ``setup`` (run directory, the model it starts from
with its frozen layers, features ``P <sep> Q <sep> <cls>`` with windows and max-context from
``train.squad``, the original's optimiser from ``train.engine.optim``, a resumed checkpoint), ``train``
(the engine's loop, evaluating on the dev file every N steps with the official metrics),
``save_checkpoint`` and ``cleanup``. ``OUT`` receives the FINAL model and its dev metrics (its metadata
carries the no-answer threshold and answerability that export and serving use by default); with
``keep_best`` the checkpoint with the highest dev best_f1 also goes to ``OUT/best``, labelled with the
data it was selected on. The training state lives on the recipe.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from qa_core.squad import (
    Answerability,
    DecodeOptions,
    featurize,
    pad_batch,
    read_squad,
    subsample_out_of_window,
)
from train.answerability.fit import fit_for
from train.engine.execution import seed_everything, to_tensors
from train.engine.loop import LoopPlan, StepReport
from train.engine.optim import make_optimizer, make_scheduler
from train.engine.recipe import Recipe
from train.engine.runlog import LogInterval, MetricsLog
from train.engine.session import Resumed, Session, stopped_line
from train.evaluation.predict import (
    EvalResult,
    evaluate_predictions,
    redecide,
    run_evaluation,
    write_prediction_files,
)
from train.model import checkpoint
from train.recipes.finetune_config import FinetuneConfig
from train.recipes.finetune_setup import (
    FeatureBatches,
    freeze,
    load_tokenizer_and_model,
    micro_batch_size,
    resolve_grad_accum,
    trained_through_frozen,
)
from train.squad.provenance import FINE_TUNED_ON, THRESHOLD_SELECTED_ON, article_titles

LABELLED_INPUTS = (
    "token_type_ids",
    "attention_mask",
    "p_mask",
    "cls_index",
    "start_positions",
    "end_positions",
    "is_impossible",
)


def qa_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The fine-tuning loss of one labelled batch (``pad_batch(..., include_labels=True)`` as tensors):
    the one spelling of the step's forward, which the memory benchmark measures too."""
    return model(batch["input_ids"], **{name: batch[name] for name in LABELLED_INPUTS}).loss


def check_data_files(config: FinetuneConfig) -> None:
    """--train-file and --dev-file given and present (one clear line otherwise)."""
    for flag, f in (("--train-file", config.train_file), ("--dev-file", config.dev_file)):
        if f is None:
            raise ValueError(f"{flag} is required (unless --resume continues a run that recorded it)")
        if not Path(f).exists():
            raise FileNotFoundError(f"data file not found: {f}")


def say(line: str) -> None:
    """A line while the training bar is open: tqdm clears and redraws the bar, a plain print lands on it."""
    tqdm.write(line)
    sys.stdout.flush()


def fit_final_answerability(
    config: FinetuneConfig, train_examples, dev_examples, predictions
) -> Answerability | None:
    """The final model's answerability (None: cls only): the question verifier fitted on the
    fine-tuning questions (it reads no model output), the rest cross-fitted on the dev file's articles."""
    if config.answerability == "cls":
        return None
    try:
        a = fit_for(
            config.answerability,
            train_examples,
            dev_examples,
            predictions,
            config.calibration,
            config.rerank,
            reranker_model=config.reranker,
        )
    except ValueError as exc:  # one paragraph's worth of questions, or a single class: nothing to fit
        say(f"answerability: not fitted ({exc}); the final model decides by sigmoid(cls_logit)")
        return None
    if a.reranker is not None:
        say(a.reranker.summary())
    say(f"answerability ({config.answerability}, fitted on {config.dev_file}): {a.report['decision']}")
    return a


class FinetuneRecipe(Recipe):
    """A fine-tuning run: ``run()`` is ``setup()``, ``train()``, ``cleanup()``; the engine's loop calls
    ``micro_loss``, ``after_step`` (which evaluates) and ``save_checkpoint``."""

    command = "finetune"
    session: Session
    trainable: int  # trainable parameters after freezing
    init_meta: dict  # the metadata of the --init checkpoint
    grad_accum: int  # micro-batches per step (resolved from --grad-accum or the --recipe)
    total_steps: int

    def __init__(self, config: FinetuneConfig) -> None:
        self.config = config
        self.step = 0
        self.best_f1 = -1.0  # the highest dev best_f1 so far (a selection on dev) and its step
        self.best_step: int | None = None
        self.final_metrics: dict | None = None
        self.last_loss = float("nan")

    def setup(self) -> None:
        """Open the run (data files checked before it is recorded), model, features, optimiser; resume."""
        self.session, self.config = Session.open(self.command, self.config, validate=check_data_files)
        c, d = self.config, self.session.dist
        seed_everything(c.seed)
        self.tokenizer, self.model, self.init_meta = load_tokenizer_and_model(c, self.session.out)
        self.model.to(d.device)
        self.model.transformer.activation_checkpointing = c.activation_checkpointing
        self.trainable = freeze(self.model, c.freeze_layers, c.freeze_embeddings)
        self.setup_data()
        self.setup_optimizer()
        resumed = self.load_checkpoint()
        step_config = dataclasses.replace(c, grad_accum=self.grad_accum)
        self.trainer = self.session.train_step(
            self.model, self.optimizer, self.scheduler, step_config, resumed
        )
        self.log = MetricsLog(
            self.session.out,
            enabled=d.is_main,
            resume_step=self.step,
            plots={"loss.png": ["loss"], "dev_f1.png": ["dev_f1", "dev_best_f1", "dev_exact"]},
        )
        self.announce()
        self.bar = self.session.progress(self.total_steps, self.step, c)
        self.interval = LogInterval()

    def setup_data(self) -> None:
        """The training and dev questions and their features (windows)."""
        c = self.config
        assert c.train_file and c.dev_file  # check_data_files ran
        self.train_examples = read_squad(c.train_file)
        self.dev_examples = read_squad(c.dev_file)
        if c.max_dev_examples:
            self.dev_examples = self.dev_examples[: c.max_dev_examples]
        m = c.model
        fkw: dict[str, Any] = {
            "max_seq_len": m.max_seq_len,
            "doc_stride": m.doc_stride,
            "max_query_len": m.max_query_len,
        }
        features = featurize(
            self.train_examples, self.tokenizer, is_training=True, plausible_spans=c.plausible_spans, **fkw
        )
        self.train_features = subsample_out_of_window(
            features, self.train_examples, c.keep_out_of_window, c.seed
        )
        self.dev_features = featurize(self.dev_examples, self.tokenizer, **fkw)
        if not self.train_features:
            raise ValueError(f"{c.train_file}: no training features")

    def setup_optimizer(self) -> None:
        """Batch sizes, the step count, optimizer, schedule and the feature batches."""
        c, d = self.config, self.session.dist
        self.grad_accum = resolve_grad_accum(c, d.world_size)
        self.batch_size = micro_batch_size(c, d.world_size)
        per_epoch = max(1, len(self.train_features) // (self.batch_size * d.world_size * self.grad_accum))
        self.total_steps = c.steps if c.steps is not None else max(1, math.ceil(c.epochs * per_epoch))
        self.warmup = c.warmup if c.warmup is not None else int(0.1 * self.total_steps)
        self.optimizer = make_optimizer(
            self.model,
            lr=c.lr,
            weight_decay=c.weight_decay,
            layer_decay=c.layer_decay,
            layer_decay_mode=c.layer_decay_on,
            optimizer=c.optimizer,
            eps=c.adam_eps,
        )
        self.scheduler = make_scheduler(
            self.optimizer, self.total_steps, self.warmup, c.decay, c.min_lr_ratio
        )
        self.batches = FeatureBatches(len(self.train_features), self.batch_size, c.seed, d.rank, d.world_size)

    def load_checkpoint(self) -> Resumed | None:
        """On --resume, the newest checkpoint's weights, optimizer, RNG, batch position and best so far."""
        out = self.session.out
        resumed = self.session.resume(self.config, self.model, self.optimizer, self.scheduler)
        if resumed is None:
            return None
        self.step = resumed.step
        self.batches.load_state_dict(resumed.data)
        self.best_f1 = resumed.extra.get("best_f1", -1.0)
        self.best_step = resumed.extra.get("best_step")
        if self.session.dist.is_main:
            print(
                f"Resumed from {resumed.path} at step {self.step} (best_f1 so far {self.best_f1:.2f})",
                flush=True,
            )
        if self.step >= self.total_steps and (out / "metadata.json").exists():  # finished: report it again
            self.final_metrics = json.loads((out / "metadata.json").read_text()).get("dev_metrics")
        return resumed

    def announce(self) -> None:
        c, d = self.config, self.session.dist
        if not d.is_main:
            return
        n_imp = sum(f.is_impossible for f in self.train_features)
        recipe = f"recipe {c.recipe}, " if c.recipe else ""
        print(
            f"Fine-tuning head={c.head} ({self.trainable / 1e6:.2f}M trainable params) on "
            f"{len(self.train_examples)} questions -> {len(self.train_features)} features ({n_imp} no-answer); "
            f"dev {len(self.dev_examples)} questions; {recipe}{self.total_steps} steps of "
            f"{self.batch_size * d.world_size * self.grad_accum} windows, warmup {self.warmup}, lr {c.lr:g}, "
            f"layer decay {c.layer_decay:g} on {c.layer_decay_on}",
            flush=True,
        )
        trained = trained_through_frozen(self.model, c.freeze_layers)
        if trained:
            hint = " (--freeze-embeddings stops that)" if "word_embedding.weight" in trained else ""
            print(
                f"note: the {c.freeze_layers} frozen layers still keep activations for backward: gradients "
                f"pass through them to {', '.join(trained)}{hint}",
                flush=True,
            )

    def loop_plan(self) -> LoopPlan:
        return LoopPlan(self.step, self.total_steps, self.config.save_every, self.config.stop_after)

    def micro_loss(self, train_model: torch.nn.Module, _: int) -> torch.Tensor:
        idx = self.batches.next_indices()
        arrays = pad_batch([self.train_features[i] for i in idx], include_labels=True)
        t = to_tensors(arrays, self.session.dist.device)
        self.interval.add_items(len(idx))
        return qa_loss(train_model, t)

    def after_step(self, r: StepReport) -> None:
        """Log every --log-every steps, evaluate every --eval-every steps and at the last."""
        c, last = self.config, r.step == self.total_steps
        self.last_loss = r.loss
        self.interval.add_step(r.loss)
        if r.step % c.log_every == 0 or last:
            elapsed = self.interval.elapsed()
            self.log.log(
                r.step,
                loss=r.loss,
                lr=self.scheduler.get_last_lr()[0],
                grad_norm=r.outcome.grad_norm,
                epoch=self.batches.epoch,
                features_per_s=self.interval.items / max(elapsed, 1e-9),
                s_per_step=elapsed / max(1, self.interval.steps),
                skipped_steps=self.trainer.skipped_total,
            )
            shown = {"loss": f"{r.loss:.3f}"}
            if self.best_step is not None:  # no evaluation yet: no best_f1 to show
                shown["best_f1"] = f"{self.best_f1:.1f}"
            self.bar.set_postfix(shown)
            self.interval.reset()
        self.bar.update(1)
        if self.session.dist.is_main and (r.step % c.eval_every == 0 or last):
            m = self.evaluate(r.step, final=last)
            if last:
                self.final_metrics = m
            self.bar.write(
                f"step {r.step}: dev EM {m['exact']:.2f} F1 {m['f1']:.2f} best_f1 {m['best_f1']:.2f}"
            )

    def evaluate(self, at_step: int, final: bool) -> dict:
        """Dev metrics of the current weights; the final model always goes to OUT, the best to OUT/best."""
        c = self.config
        result = run_evaluation(
            self.model,
            self.dev_examples,
            self.dev_features,
            DecodeOptions.of(c.model),
            batch_size=c.eval_batch_size,
            device=self.session.dist.device,
        )
        # The cls-only threshold: where dev best_f1 is reached (as the original's threshold search); re-score at it.
        thr = min(max(float(result.metrics.get("best_f1_thresh", 0.5)), 0.0), 1.0)
        result.predictions = redecide(self.dev_examples, result.predictions, Answerability.cls_only(thr))
        m = result.metrics = evaluate_predictions(self.dev_examples, result.predictions)
        self.log.log(
            at_step, dev_exact=m["exact"], dev_f1=m["f1"], dev_best_f1=m["best_f1"], dev_threshold=thr
        )
        self.log.plot()
        if m["best_f1"] > self.best_f1:
            self.best_f1, self.best_step = m["best_f1"], at_step
            if c.keep_best:
                self.save_best(result, thr, at_step)
        if final:
            self.save_model(result, thr, at_step)
        return m

    def save_best(self, result: EvalResult, threshold: float, at_step: int) -> None:
        meta = self.metadata(result.metrics, threshold, at_step) | {
            "selected_on": str(self.config.dev_file),
            "selection": "highest dev best_f1 over the evaluations; its dev metrics are optimistic",
        }
        best = self.session.out / "best"
        checkpoint.save(self.model, best, tokenizer=self.tokenizer, metadata=meta)
        write_prediction_files(best / "dev_predictions", result)

    def save_model(self, result: EvalResult, threshold: float, at_step: int) -> None:
        """The final model into OUT, with its answerability fitted and its dev predictions."""
        answerability = fit_final_answerability(
            self.config, self.train_examples, self.dev_examples, result.predictions
        )
        meta = self.metadata(result.metrics, threshold, at_step, answerability)
        checkpoint.save_into(self.model, self.session.out, tokenizer=self.tokenizer, metadata=meta)
        write_prediction_files(self.session.out / "dev_predictions", result)

    def metadata(
        self, metrics: dict, threshold: float, at_step: int, answerability: Answerability | None = None
    ) -> dict:
        c = self.config
        # what evaluation, the export and the server read back (from_metadata), with the fitted threshold
        settings = dataclasses.replace(c.model, no_answer_threshold=float(threshold))
        return {
            "stage": "finetune",
            "step": at_step,
            "head": c.head,
            "recipe": c.recipe,
            **settings.as_dict(),
            "threshold_selected_on": str(c.dev_file),
            THRESHOLD_SELECTED_ON: article_titles(self.dev_examples),
            FINE_TUNED_ON: article_titles(self.train_examples),
            "answerability": answerability.to_dict() if answerability is not None else None,
            "dev_metrics": metrics,
            "dev_file": str(c.dev_file),
            "init": str(c.init) if c.init else None,
            "init_metadata_stage": self.init_meta.get("stage"),
        }

    def save_checkpoint(self, step: int) -> None:
        """A resumable checkpoint (rank 0 writes; the batch position and the best so far beside it)."""
        self.session.save_state(
            step,
            self.trainer,
            tokenizer=self.tokenizer,
            data_state=self.batches.state_dict(),
            keep_last=self.config.keep_last,
            extra={"best_f1": self.best_f1, "best_step": self.best_step},
            metadata={"stage": "finetune-state", "head": self.config.head},
        )
        self.log.plot()  # at saves, evaluations and the end, not every log step

    def cleanup(self) -> dict:
        """Report the final model, close the process group; returns the run's summary."""
        c, out = self.config, self.session.out
        self.bar.close()
        self.log.close()
        if self.session.dist.is_main and self.step < self.total_steps:
            print(stopped_line("train.finetune", self.step, self.total_steps, out), flush=True)
        if self.session.dist.is_main and self.final_metrics is not None:
            m = self.final_metrics
            best = f"; the best of the evaluations (selected on {c.dev_file}) is in {out / 'best'}"
            print(
                f"Done: {self.step} steps, final loss {self.last_loss:.4f}. Final model in {out}: dev EM "
                f"{m['exact']:.2f} F1 {m['f1']:.2f} at no-answer threshold {m['threshold']:.3f} (chosen on "
                f"{c.dev_file}); best_exact {m['best_exact']:.2f} best_f1 {m['best_f1']:.2f} (threshold tuned on "
                f"the same questions, as the original reports){best if c.keep_best else ''}",
                flush=True,
            )
        self.session.close()
        return {
            "step": self.step,
            "loss": self.last_loss,
            "final_metrics": self.final_metrics,
            "best_f1": self.best_f1,  # the highest dev best_f1 over the evaluations (a selection on dev)
            "best_step": self.best_step,
            "trainable_params": self.trainable,
        }
