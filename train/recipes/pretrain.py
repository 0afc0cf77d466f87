"""Pretraining as a recipe: XLNet permutation language modelling with two-stream attention.

:class:`PretrainConfig` holds every setting (one field per ``python -m train.pretrain`` flag, with its
default); :class:`PretrainRecipe` runs it in stages: ``setup`` (run directory, tokenizer given or
trained on the corpus, data streams with span targets and permutation masks from ``train.data``, the
LM model, random or ``--init`` (``train.recipes.pretrain_init``), the original's Adam and
warmup/decay, a resumed checkpoint), ``train`` (the engine's loop, Transformer-XL memory carried from
batch to batch), ``save_checkpoint`` (atomic and resumable, each rank's data position and memory)
and ``cleanup`` (the final model, the process group). The training state lives on the recipe.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional as F

from qa_core.tokenizer import XLNetTokenizer
from train.common.sample_data import SAMPLE_CORPUS, SAMPLE_TRAIN
from train.data import PretrainBatches, PretrainDataConfig
from train.data.prepare import prepare_directory
from train.data.shards import TOKENIZER_DIR, ShardedCorpus
from train.engine.execution import Dist, autocast, seed_everything, to_tensors
from train.engine.loop import LoopPlan, StepReport
from train.engine.optim import make_optimizer, make_scheduler
from train.engine.recipe import Recipe
from train.engine.runlog import LogInterval, MetricsLog
from train.engine.session import Resumed, Session, stopped_line
from train.model import XLNetConfig, XLNetLMHeadModel, checkpoint
from train.recipes.pretrain_config import PretrainConfig
from train.recipes.pretrain_init import InitSource
from train.tokenizer import train_spm


def pretrain_loss(model, batch: dict[str, torch.Tensor], mems=None, precision: str = "fp32", **forward):
    """Mean cross-entropy of the query stream over the real targets; returns (loss, new mems).
    ``forward`` goes to the model as is (``use_mems=True`` makes a HuggingFace model return its memory)."""
    with autocast(precision, batch["input_ids"].device):
        out = model(
            batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            perm_mask=batch["perm_mask"],
            target_mapping=batch["target_mapping"],
            mems=mems,
            **forward,
        )
    logits = out.logits.float()
    nll = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch["target_ids"].reshape(-1), reduction="none"
    )
    weights = batch["target_weights"].reshape(-1)
    return (nll * weights).sum() / weights.sum().clamp_min(1.0), out.mems


def check_corpus(config: PretrainConfig) -> None:
    """--corpus or --data, present (the shipped sample when neither is given)."""
    if config.data and config.corpus:
        raise ValueError("give --corpus (prepared into the run) or --data (prepared already), not both")
    if config.data and config.train_spm:
        raise ValueError("--data holds its tokenizer: --train-spm does not apply")
    if config.data:
        ShardedCorpus(config.data)  # a missing or unfinished directory fails here, in one line
        return
    config.corpus = config.corpus or [str(SAMPLE_CORPUS), str(SAMPLE_TRAIN)]
    for f in config.corpus:
        if not Path(f).exists():
            raise FileNotFoundError(f"corpus file not found: {f}")


def check_inputs(config: PretrainConfig) -> None:
    """The corpus and, with --init, the checkpoint against the flags: before the run is recorded."""
    check_corpus(config)
    if config.init:
        InitSource.open(config)


def unigram_entropy(counts: np.ndarray) -> float:
    """Entropy (nats/token) of the corpus' unigram distribution: the loss of a model that ignores context."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def open_corpus(
    config: PretrainConfig, tokenizer: XLNetTokenizer, out: Path, d: Dist, source: str = "this run"
) -> ShardedCorpus:
    """``--data`` as it is, or ``--corpus`` prepared into ``out/data`` by the main rank (kept for resumes);
    either way, ids of another tokenizer than ``source``'s are refused."""
    if config.data:
        corpus = ShardedCorpus(config.data)
    else:
        if d.is_main:
            prepare_directory(config.corpus or [], tokenizer, out / "data", workers=1)
        if d.enabled:
            dist.barrier()
        corpus = ShardedCorpus(out / "data")
    corpus.require_tokenizer(tokenizer.fingerprint(), source)
    return corpus


def resolve_tokenizer(config: PretrainConfig, out: Path, d: Dist) -> XLNetTokenizer:
    """--spm, the tokenizer of --data, or one trained on --corpus into ``out/tokenizer`` (kept for resumes)."""
    if config.spm:
        spm = Path(config.spm)
        return (
            XLNetTokenizer.from_dir(spm) if spm.is_dir() else XLNetTokenizer(spm, do_lower_case=config.lower)
        )
    if config.data:
        return XLNetTokenizer.from_dir(Path(config.data) / TOKENIZER_DIR)
    tok_dir = out / "tokenizer"
    corpus = config.corpus or []
    if d.is_main and not (tok_dir / "spiece.model").exists():
        vocab = config.train_spm or 8000
        print(f"Training a sentencepiece model (vocab {vocab}) on {len(corpus)} file(s) ...", flush=True)
        train_spm(corpus, tok_dir, vocab, do_lower_case=config.lower)
    if d.enabled:
        dist.barrier()
    return XLNetTokenizer.from_dir(tok_dir)


def model_config(config: PretrainConfig, vocab_size: int) -> XLNetConfig:
    return XLNetConfig.preset(
        config.config,
        vocab_size=vocab_size,
        n_layer=config.n_layer,
        d_model=config.d_model,
        n_head=config.n_head,
        d_inner=config.d_inner,
        dropout=config.dropout,
        ff_activation=config.activation,
        use_aoa=config.aoa,
        mem_len=config.mem_len,
        reuse_len=config.reuse_len,
        bi_data=config.bi_data,
        clamp_len=config.clamp_len,
    )


def data_config(config: PretrainConfig) -> PretrainDataConfig:
    """The data pipeline's knobs of a run: the fields of :class:`PretrainDataConfig`, by name, from the
    run's config (which declares each one as a flag)."""
    return PretrainDataConfig(
        **{f.name: getattr(config, f.name) for f in dataclasses.fields(PretrainDataConfig)}
    )


def load_mems(path: Path, d: Dist) -> list[torch.Tensor] | None:
    """This rank's Transformer-XL memory as a checkpoint saved it (None: none was carried)."""
    tensors = torch.load(Path(path) / "trainer.pt", map_location="cpu", weights_only=True)
    stacked = tensors.get("mems", {}).get(f"rank{d.rank}")
    if stacked is None or stacked.numel() == 0:
        return None
    return [m.to(d.device) for m in stacked.unbind(0)]


class PretrainRecipe(Recipe):
    """A pretraining run: ``run()`` is ``setup()``, ``train()``, ``cleanup()``; the engine's loop calls
    ``micro_loss``, ``after_step`` and ``save_checkpoint``."""

    command = "pretrain"
    session: Session
    tokenizer: XLNetTokenizer
    data: PretrainBatches
    baseline: float  # unigram entropy of the corpus, nats/token
    model: XLNetLMHeadModel
    mems: list[torch.Tensor] | None  # Transformer-XL memory carried to the next batch
    init: InitSource | None  # --init: the model the run starts from

    def __init__(self, config: PretrainConfig) -> None:
        self.config = config
        self.step = 0
        self.last_loss = float("nan")  # the mean loss of the last log interval

    def setup(self) -> None:
        """Open the run (checked before it is recorded), data, model, optimiser; resume if asked."""
        self.session, self.config = Session.open(self.command, self.config, validate=check_inputs)
        c, d = self.config, self.session.dist
        self.init = InitSource.open(c) if c.init else None
        if self.init:
            self.tokenizer, source = self.init.tokenizer, f"--init {self.init.path}"
        else:
            self.tokenizer, source = resolve_tokenizer(c, self.session.out, d), "this run"
        corpus = open_corpus(c, self.tokenizer, self.session.out, d, source)
        self.data = PretrainBatches(
            corpus, self.tokenizer.word_start_table, data_config(c), rank=d.rank, world_size=d.world_size
        )
        self.baseline = unigram_entropy(corpus.unigram_counts())
        seed_everything(c.seed)  # identical initial weights on every rank
        if self.init:
            self.model = self.init.load_model(c).to(d.device)
        else:
            self.model = XLNetLMHeadModel(model_config(c, self.tokenizer.vocab_size)).to(d.device)
        self.model.transformer.activation_checkpointing = c.activation_checkpointing
        self.optimizer = make_optimizer(
            self.model, lr=c.lr, weight_decay=c.weight_decay, optimizer=c.optimizer, eps=c.adam_eps
        )
        self.scheduler = make_scheduler(self.optimizer, c.steps, c.warmup, c.decay, c.min_lr_ratio)
        self.mems = None
        seed_everything(c.seed + 1000 * d.rank)  # dropout streams differ per rank
        resumed = self.load_checkpoint()
        self.trainer = self.session.train_step(self.model, self.optimizer, self.scheduler, c, resumed)
        self.log = MetricsLog(
            self.session.out,
            enabled=d.is_main,
            resume_step=self.step,
            plots={"loss.png": ["loss", "unigram_baseline"]},
        )
        self.announce()
        self.tokens_per_step = c.batch_size * c.seq_len * c.grad_accum * d.world_size
        self.bar = self.session.progress(c.steps, self.step, c)
        self.interval = LogInterval()

    def load_checkpoint(self) -> Resumed | None:
        """On --resume, the newest checkpoint's weights, optimizer, RNG, data position and memory."""
        c, d, out = self.config, self.session.dist, self.session.out
        resumed = self.session.resume(c, self.model, self.optimizer, self.scheduler)
        if c.resume and resumed is None and d.is_main:
            print(f"--resume: no checkpoint in {out}/checkpoints, starting from scratch", flush=True)
        if resumed is not None:
            self.step = resumed.step
            data = resumed.data
            self.data.load_state_dict(data[d.rank] if isinstance(data, list) else data)
            self.mems = load_mems(resumed.path, d)
            if d.rank > 0:
                seed_everything(c.seed + 1000 * d.rank + self.step)
            if d.is_main:
                print(f"Resumed from {resumed.path} at step {self.step}", flush=True)
        return resumed

    def announce(self) -> None:
        if not self.session.dist.is_main:
            return
        n_params = sum(p.numel() for p in self.model.parameters())
        what = f"from {self.init.path}" if self.init else self.config.config
        print(
            f"Pretraining {what} ({n_params / 1e6:.2f}M params, vocab "
            f"{self.model.config.vocab_size}) on {self.data.num_tokens:,} tokens, {len(self.data)} batches/pass, "
            f"world {self.session.dist.world_size}; unigram-entropy baseline {self.baseline:.3f} nats/token",
            flush=True,
        )

    def loop_plan(self) -> LoopPlan:
        c = self.config
        return LoopPlan(self.step, c.steps, c.save_every, c.stop_after)

    def micro_loss(self, train_model: torch.nn.Module, _: int) -> torch.Tensor:
        if self.data.step_in_pass == 0:
            self.mems = None  # streams restart: old memory is not the preceding text
        batch = to_tensors(next(self.data), self.session.dist.device)
        loss, self.mems = pretrain_loss(train_model, batch, self.mems, self.config.precision)
        return loss

    def after_step(self, r: StepReport) -> None:
        c, interval = self.config, self.interval
        interval.add_step(r.loss)
        interval.add_items(self.tokens_per_step)
        if r.step % c.log_every == 0 or r.step == c.steps or r.stopping:
            tps = interval.items / max(interval.elapsed(), 1e-9)
            lr = self.scheduler.get_last_lr()[0]
            self.last_loss = interval.mean_loss()
            self.log.log(
                r.step,
                loss=self.last_loss,
                step_loss=r.loss,
                lr=lr,
                grad_norm=r.outcome.grad_norm,
                tokens_per_s=tps,
                unigram_baseline=self.baseline,
                skipped_steps=self.trainer.skipped_total,
            )
            self.bar.set_postfix(loss=f"{self.last_loss:.3f}", tok_s=f"{tps:.0f}", lr=f"{lr:.2e}")
            interval.reset()
        self.bar.update(1)

    def save_checkpoint(self, step: int) -> None:
        """Every rank contributes its data position (and memory); only rank 0 writes."""
        data_state, mems = self._rank_states()
        extra_tensors = {
            f"rank{r}": torch.stack(m) if m is not None else torch.empty(0) for r, m in enumerate(mems)
        }
        self.session.save_state(
            step,
            self.trainer,
            tokenizer=self.tokenizer,
            data_state=data_state,
            metadata=self.metadata(step),
            keep_last=self.config.keep_last,
            extra_tensors={"mems": extra_tensors},
        )
        self.log.plot()  # at saves and at the end, not every log step: matplotlib is slow

    def _rank_states(self) -> tuple[Any, list[Any]]:
        """This rank's data position and memory, or every rank's (gathered) under torchrun."""
        data_state = self.data.state_dict()
        mem_cpu = [m.detach().cpu() for m in self.mems] if self.mems is not None else None
        d = self.session.dist
        if not d.enabled:
            return data_state, [mem_cpu]
        gathered_data: list[Any] = [None] * d.world_size
        gathered_mems: list[Any] = [None] * d.world_size
        dist.all_gather_object(gathered_data, data_state)
        dist.all_gather_object(gathered_mems, mem_cpu)
        return gathered_data, gathered_mems

    def metadata(self, step: int) -> dict:
        return {
            "stage": "pretrain",
            "step": step,
            "loss": self.last_loss,
            "unigram_baseline": self.baseline,
            "args": {
                k: v
                for k, v in vars(self.config).items()
                if isinstance(v, int | float | str | list | bool | None)
            },
        }

    def cleanup(self) -> dict:
        """The final model (once --steps are done), the process group; returns the run's summary."""
        c, out = self.config, self.session.out
        self.bar.close()
        if self.session.dist.is_main and self.step >= c.steps:
            checkpoint.save_into(self.model, out, tokenizer=self.tokenizer, metadata=self.metadata(self.step))
            self.log.plot()
            print(
                f"Done: step {self.step}, loss {self.last_loss:.4f} (unigram baseline {self.baseline:.4f}); "
                f"model in {out}",
                flush=True,
            )
        elif self.session.dist.is_main:
            print(stopped_line("train.pretrain", self.step, c.steps, out), flush=True)
        self.log.close()
        self.session.close()
        return {"step": self.step, "loss": self.last_loss, "baseline": self.baseline}
