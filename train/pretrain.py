"""`python -m train.pretrain`: XLNet permutation language modelling with two-stream attention.

Thin CLI over `pretrain(args)`: tokenizer (given or trained on the corpus), data streams with span
targets and permutation masks (`train.data`), the LM model with Transformer-XL memory carried from
batch to batch, the original's Adam, clipping and warmup/decay (`train.engine.optim`), gradient
accumulation, atomic resumable checkpoints, metrics.jsonl + loss PNG, and DistributedDataParallel
under torchrun.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional as F
from tqdm import tqdm

from train.common.cli import Parser, run
from train.common.sample_data import SAMPLE_CORPUS, SAMPLE_TRAIN
from train.data import PretrainBatches, PretrainDataConfig
from train.data.shards import TOKENIZER_DIR, ShardedCorpus
from train.engine.loop import LoopPlan, StepReport, run_loop
from train.engine.optim import DECAYS, OPTIMIZERS, make_optimizer, make_scheduler
from train.engine.run_record import add_run_flags, explicit_flags, open_run
from train.engine.runlog import MetricsLog
from train.engine.runtime import Dist, autocast, init_distributed, seed_everything
from train.engine.state import latest_checkpoint, load_training_state, save_training_state
from train.engine.step import TrainStep
from train.model import ACTIVATIONS, PRESETS, XLNetConfig, XLNetLMHeadModel, checkpoint
from train.prepare_corpus import prepare_directory
from train.tokenizer import XLNetTokenizer, train_spm


def build_parser() -> Parser:
    p = Parser(prog="python -m train.pretrain", description=__doc__.splitlines()[0])
    g = p.add_argument_group("data")
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
        default=None,
        help="train a sentencepiece model of this size on the corpus first (default 8000 when no --spm)",
    )
    g.add_argument(
        "--lower", action="store_true", help="lower-case text (uncased model) when training the spm"
    )
    g.add_argument("--seq-len", type=int, default=128, help="tokens per example (paper: 512)")
    g.add_argument(
        "--reuse-len", type=int, default=64, help="tokens cached as memory for the next batch (paper: 256)"
    )
    g.add_argument("--mem-len", type=int, default=64, help="memory length in tokens (paper: 384)")
    g.add_argument("--perm-size", type=int, default=None, help="local permutation size (default: reuse-len)")
    g.add_argument(
        "--num-predict", type=int, default=None, help="targets per example (default: seq-len // 6)"
    )
    g.add_argument("--mask-alpha", type=int, default=6, help="context tokens per span unit")
    g.add_argument("--mask-beta", type=int, default=1, help="tokens predicted per mask-alpha tokens")
    g.add_argument("--max-gram", type=int, default=5, help="longest span length")
    g.add_argument("--bi-data", action="store_true", help="half of each batch reads the streams backwards")
    g = p.add_argument_group("model")
    g.add_argument("--config", default="small", choices=sorted(PRESETS), help="model size preset")
    g.add_argument("--n-layer", type=int)
    g.add_argument("--d-model", type=int)
    g.add_argument("--n-head", type=int)
    g.add_argument("--d-inner", type=int)
    g.add_argument("--dropout", type=float, default=None, help="override the preset's dropout")
    g.add_argument("--activation", choices=ACTIVATIONS, default="gelu", help="feed-forward activation")
    g.add_argument("--aoa", action="store_true", help="Attention-on-Attention in every layer")
    g.add_argument("--clamp-len", type=int, default=-1, help="clamp relative distances (-1: no clamp)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=500, help="optimizer steps")
    g.add_argument("--batch-size", type=int, default=8, help="sequences per rank per micro-batch")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (paper: 4e-4 base)")
    g.add_argument("--warmup", type=int, default=50, help="linear warmup steps")
    g.add_argument("--decay", choices=DECAYS, default="linear")
    g.add_argument(
        "--min-lr-ratio", type=float, default=0.0, help="final lr as a fraction of the peak (original: 0.001)"
    )
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="xlnet", help="xlnet (original) or adamw")
    g.add_argument("--weight-decay", type=float, default=0.0, help="original train_gpu.py default: 0")
    g.add_argument("--adam-eps", type=float, default=1e-6)
    g.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
    g.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda")
    g.add_argument("--seed", type=int, default=42)
    g.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)"
    )
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, help="run directory (checkpoint, metrics.jsonl, loss.png)")
    add_run_flags(g)
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--save-every", type=int, default=200)
    g.add_argument("--keep-last", type=int, default=2, help="step checkpoints to keep")
    g.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="exit (with a checkpoint) after this many steps of this invocation; for tests of resume",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def pretrain_loss(model, batch: dict[str, torch.Tensor], mems=None, precision: str = "fp32"):
    """Mean cross-entropy of the query stream over the real targets; returns (loss, new mems)."""
    with autocast(precision, batch["input_ids"].device):
        out = model(
            batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            perm_mask=batch["perm_mask"],
            target_mapping=batch["target_mapping"],
            mems=mems,
        )
    logits = out.logits.float()
    nll = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch["target_ids"].reshape(-1), reduction="none"
    )
    weights = batch["target_weights"].reshape(-1)
    return (nll * weights).sum() / weights.sum().clamp_min(1.0), out.mems


def check_corpus(args) -> None:
    if args.data and args.corpus:
        raise ValueError("give --corpus (prepared into the run) or --data (prepared already), not both")
    if args.data and args.train_spm:
        raise ValueError("--data holds its tokenizer: --train-spm does not apply")
    if args.data:
        ShardedCorpus(args.data)  # a missing or unfinished directory fails here, in one line
        return
    args.corpus = args.corpus or [str(SAMPLE_CORPUS), str(SAMPLE_TRAIN)]
    for f in args.corpus:
        if not Path(f).exists():
            raise FileNotFoundError(f"corpus file not found: {f}")


def unigram_entropy(counts: np.ndarray) -> float:
    """Entropy (nats/token) of the corpus' unigram distribution: the loss of a model that ignores context."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def open_corpus(args, tokenizer: XLNetTokenizer, out: Path, d: Dist) -> ShardedCorpus:
    """``--data`` as it is, or ``--corpus`` prepared into ``out/data`` by the main rank (kept for resumes);
    either way, ids of another tokenizer are refused."""
    if args.data:
        corpus = ShardedCorpus(args.data)
    else:
        if d.is_main:
            prepare_directory(args.corpus, tokenizer, out / "data", workers=1)
        if d.enabled:
            dist.barrier()
        corpus = ShardedCorpus(out / "data")
    if corpus.tokenizer_fingerprint != tokenizer.fingerprint():
        raise ValueError(
            f"{corpus.directory}: its token ids come from another tokenizer ({corpus.tokenizer_fingerprint[:12]}, "
            f"this one is {tokenizer.fingerprint()[:12]}): prepare the corpus again with this --spm"
        )
    return corpus


def resolve_tokenizer(args, out: Path, d: Dist) -> XLNetTokenizer:
    if args.spm:
        spm = Path(args.spm)
        return XLNetTokenizer.from_dir(spm) if spm.is_dir() else XLNetTokenizer(spm, do_lower_case=args.lower)
    if args.data:
        return XLNetTokenizer.from_dir(Path(args.data) / TOKENIZER_DIR)
    tok_dir = out / "tokenizer"
    if d.is_main and not (tok_dir / "spiece.model").exists():
        vocab = args.train_spm or 8000
        print(f"Training a sentencepiece model (vocab {vocab}) on {len(args.corpus)} file(s) ...", flush=True)
        train_spm(args.corpus, tok_dir, vocab, do_lower_case=args.lower)
    if d.enabled:
        dist.barrier()
    return XLNetTokenizer.from_dir(tok_dir)


def to_tensors(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v).to(device) for k, v in batch.items()}


def model_config(args, vocab_size: int) -> XLNetConfig:
    return XLNetConfig.preset(
        args.config,
        vocab_size=vocab_size,
        n_layer=args.n_layer,
        d_model=args.d_model,
        n_head=args.n_head,
        d_inner=args.d_inner,
        dropout=args.dropout,
        ff_activation=args.activation,
        use_aoa=args.aoa,
        mem_len=args.mem_len,
        reuse_len=args.reuse_len,
        bi_data=args.bi_data,
        clamp_len=args.clamp_len,
    )


def pretrain(args) -> dict:
    d = init_distributed(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    args = open_run(out, "pretrain", args, d, validate=check_corpus)  # checked before it is recorded
    tokenizer = resolve_tokenizer(args, out, d)
    data_cfg = PretrainDataConfig(
        seq_len=args.seq_len,
        reuse_len=args.reuse_len,
        num_predict=args.num_predict,
        perm_size=args.perm_size,
        mask_alpha=args.mask_alpha,
        mask_beta=args.mask_beta,
        max_gram=args.max_gram,
        bi_data=args.bi_data,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    corpus = open_corpus(args, tokenizer, out, d)
    data = PretrainBatches(corpus, tokenizer.word_start_table, data_cfg, rank=d.rank, world_size=d.world_size)
    baseline = unigram_entropy(corpus.unigram_counts())
    seed_everything(args.seed)  # identical initial weights on every rank
    config = model_config(args, tokenizer.vocab_size)
    model = XLNetLMHeadModel(config).to(d.device)
    optimizer = make_optimizer(
        model, lr=args.lr, weight_decay=args.weight_decay, optimizer=args.optimizer, eps=args.adam_eps
    )
    scheduler = make_scheduler(optimizer, args.steps, args.warmup, args.decay, args.min_lr_ratio)
    start_step, mems = 0, None
    seed_everything(args.seed + 1000 * d.rank)  # dropout streams differ per rank
    resume_from = latest_checkpoint(out) if args.resume else None
    if args.resume and resume_from is None and d.is_main:
        print(f"--resume: no checkpoint in {out}/checkpoints, starting from scratch", flush=True)
    if resume_from is not None:
        state = load_training_state(resume_from, model, optimizer, scheduler)  # weights, optimizer, RNG
        start_step = state["step"]
        data.load_state_dict(state["data"][d.rank] if isinstance(state["data"], list) else state["data"])
        mems = _load_mems(resume_from, d)
        if d.rank > 0:
            seed_everything(args.seed + 1000 * d.rank + start_step)
        if d.is_main:
            print(f"Resumed from {resume_from} at step {start_step}", flush=True)
    trainer = TrainStep.from_args(model, optimizer, scheduler, d, args, state if resume_from else None)
    log = MetricsLog(
        out, enabled=d.is_main, resume_step=start_step, plots={"loss.png": ["loss", "unigram_baseline"]}
    )
    n_params = sum(p.numel() for p in model.parameters())
    if d.is_main:
        print(
            f"Pretraining {args.config} ({n_params / 1e6:.2f}M params, vocab {config.vocab_size}) on "
            f"{data.num_tokens:,} tokens, {len(data)} batches/pass, world {d.world_size}; "
            f"unigram-entropy baseline {baseline:.3f} nats/token",
            flush=True,
        )
    tokens_per_step = args.batch_size * args.seq_len * args.grad_accum * d.world_size
    bar = tqdm(
        total=args.steps, initial=start_step, disable=not d.is_main or args.no_progress, dynamic_ncols=True
    )
    interval = {"t0": time.time(), "steps": 0, "finite": 0, "loss_sum": 0.0}
    last_loss = float("nan")

    def micro_loss(train_model: torch.nn.Module, _: int) -> torch.Tensor:
        nonlocal mems
        if data.step_in_pass == 0:
            mems = None  # streams restart: old memory is not the preceding text
        loss, mems = pretrain_loss(train_model, to_tensors(next(data), d.device), mems, args.precision)
        return loss

    def after_step(r: StepReport) -> None:
        nonlocal last_loss
        interval["steps"] += 1
        if math.isfinite(r.loss):  # a skipped non-finite step shows in skipped_steps, not in the mean
            interval["finite"] += 1
            interval["loss_sum"] += r.loss
        if r.step % args.log_every == 0 or r.step == args.steps or r.stopping:
            elapsed = time.time() - interval["t0"]
            tps = tokens_per_step * interval["steps"] / max(elapsed, 1e-9)
            lr = scheduler.get_last_lr()[0]
            # the mean over the log interval: a readable curve
            last_loss = interval["loss_sum"] / interval["finite"] if interval["finite"] else float("nan")
            log.log(
                r.step,
                loss=last_loss,
                step_loss=r.loss,
                lr=lr,
                grad_norm=r.outcome.grad_norm,
                tokens_per_s=tps,
                unigram_baseline=baseline,
                skipped_steps=trainer.skipped_total,
            )
            bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{tps:.0f}", lr=f"{lr:.2e}")
            interval.update(t0=time.time(), steps=0, finite=0, loss_sum=0.0)
        bar.update(1)

    def save(step: int) -> None:
        _save(out, step, model, trainer, tokenizer, data, mems, d, args, baseline, last_loss)
        log.plot()  # at saves and at the end, not every log step: matplotlib is slow

    plan = LoopPlan(start_step, args.steps, args.save_every, args.stop_after)
    step = run_loop(trainer, micro_loss, plan, d, after_step=after_step, save=save)
    bar.close()
    if d.is_main and step >= args.steps:
        checkpoint.save_into(
            model, out, tokenizer=tokenizer, metadata=_metadata(args, step, baseline, last_loss)
        )
        log.plot()
        print(
            f"Done: step {step}, loss {last_loss:.4f} (unigram baseline {baseline:.4f}); model in {out}",
            flush=True,
        )
    log.close()
    if d.enabled:
        dist.barrier()
        dist.destroy_process_group()
    return {"step": step, "loss": last_loss, "baseline": baseline}


def _metadata(args, step: int, baseline: float, loss: float) -> dict:
    return {
        "stage": "pretrain",
        "step": step,
        "loss": loss,
        "unigram_baseline": baseline,
        "args": {
            k: v for k, v in vars(args).items() if isinstance(v, int | float | str | list | bool | None)
        },
    }


def _save(out, step, model, trainer: TrainStep, tokenizer, data, mems, d: Dist, args, baseline, loss) -> None:
    """Every rank contributes its data position (and memory); only rank 0 writes."""
    data_state = data.state_dict()
    mem_cpu = [m.detach().cpu() for m in mems] if mems is not None else None
    if d.enabled:
        gathered_data: list[Any] = [None] * d.world_size
        gathered_mems: list[Any] = [None] * d.world_size
        dist.all_gather_object(gathered_data, data_state)
        dist.all_gather_object(gathered_mems, mem_cpu)
        data_state, mem_all = gathered_data, gathered_mems
    else:
        mem_all = [mem_cpu]
    if d.is_main:
        extra_tensors = {
            f"rank{r}": torch.stack(m) if m is not None else torch.empty(0) for r, m in enumerate(mem_all)
        }
        save_training_state(
            out,
            step,
            model,
            trainer.optimizer,
            trainer.scheduler,
            tokenizer=tokenizer,
            data_state=data_state,
            extra={"trainer": trainer.state_dict()},
            metadata=_metadata(args, step, baseline, loss),
            keep_last=args.keep_last,
            extra_tensors={"mems": extra_tensors},
        )
    if d.enabled:
        dist.barrier()


def _load_mems(path: Path, d: Dist):
    tensors = torch.load(Path(path) / "trainer.pt", map_location="cpu", weights_only=True)
    stacked = tensors.get("mems", {}).get(f"rank{d.rank}")
    if stacked is None or stacked.numel() == 0:
        return None
    return [m.to(d.device) for m in stacked.unbind(0)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.explicit_flags = explicit_flags(parser, argv)
    if args.spm and args.train_spm:
        raise ValueError("give either --spm or --train-spm, not both")
    pretrain(args)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.pretrain"))
