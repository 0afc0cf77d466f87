"""`python -m bench.train`: training throughput (tokens/s) of our model vs the HF oracle, same config/batch.

Pretraining step: two-stream forward with perm_mask + target_mapping + memory, LM loss over targets,
backward, AdamW step. Fine-tuning step: content stream + QA loss, backward, AdamW step. Both models
hold the same weights (ours saved, loaded into `transformers`); the ratio is measured side by side in
one run with the same thread count.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import transformers

from bench.common import machine_line, markdown_table, pct, time_runs
from train.engine.execution import autocast
from train.model import XLNetConfig, XLNetForQuestionAnswering, XLNetLMHeadModel, checkpoint
from train.recipes.pretrain import pretrain_loss

CPU = torch.device("cpu")


def pretrain_batch(b: int, t: int, p: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tm = torch.zeros(b, p, t)
    for i in range(b):
        tm[i, torch.arange(p), torch.randperm(t, generator=g)[:p]] = 1.0
    return {
        "input_ids": torch.randint(9, vocab, (b, t), generator=g),
        "token_type_ids": (torch.arange(t) >= t // 2).long().expand(b, t).contiguous(),
        "perm_mask": (torch.rand(b, t, t, generator=g) > 0.5).float(),
        "target_mapping": tm,
        "target_ids": torch.randint(9, vocab, (b, p), generator=g),
        "target_weights": torch.ones(b, p),
    }


def bench_pretrain(
    config: XLNetConfig, b: int, t: int, threads: int, runs: int, precision: str = "fp32"
) -> list[list[object]]:
    torch.manual_seed(0)
    ours = XLNetLMHeadModel(config)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.save(ours, tmp)
        hf = transformers.XLNetLMHeadModel.from_pretrained(tmp)
    p = max(1, t // 6)
    batch = pretrain_batch(b, t, p, config.vocab_size)
    mems_ours = [torch.zeros(config.mem_len, b, config.d_model)] * config.n_layer
    rows = []
    for name, model in (("HF transformers (oracle)", hf), ("ours", ours)):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        kwargs = {"use_mems": True} if model is hf else {}

        def step(model=model, opt=opt, kwargs=kwargs):
            loss, _ = pretrain_loss(model, batch, mems_ours, precision, **kwargs)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        times = time_runs(step, warmup=2, runs=runs)
        rows.append([f"pretrain {precision}: {name}", b, t, pct(times, 50) * 1e3, b * t / pct(times, 50)])
    rows.append([f"pretrain {precision}: ours / HF (tokens/s)", "", "", "", rows[1][4] / rows[0][4]])
    return rows


def bench_finetune(
    config: XLNetConfig, b: int, t: int, threads: int, runs: int, precision: str = "fp32"
) -> list[list[object]]:
    torch.manual_seed(0)
    ours = XLNetForQuestionAnswering(config, head="beam")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.save(ours, tmp)
        hf = transformers.XLNetForQuestionAnswering.from_pretrained(tmp)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(9, config.vocab_size, (b, t), generator=g)
    types = (torch.arange(t) >= t - 20).long().expand(b, t).contiguous()
    mask = torch.ones(b, t, dtype=torch.long)
    starts = torch.randint(0, t - 30, (b,), generator=g)
    ends = starts + 3
    imp = (torch.rand(b, generator=g) > 0.5).float()
    cls_index = torch.full((b,), t - 1)
    rows = []
    for name, model in (("HF transformers (oracle)", hf), ("ours", ours)):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            extra = {"attention_mask": mask.float()} if model is hf else {"attention_mask": mask}
            with autocast(precision, CPU):
                out = model(
                    ids,
                    token_type_ids=types,
                    start_positions=starts,
                    end_positions=ends,
                    is_impossible=imp,
                    cls_index=cls_index,
                    **extra,
                )
            out.loss.float().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        times = time_runs(step, warmup=2, runs=runs)
        rows.append(
            [f"fine-tune {precision} (beam head): {name}", b, t, pct(times, 50) * 1e3, b * t / pct(times, 50)]
        )
    rows.append([f"fine-tune {precision}: ours / HF (tokens/s)", "", "", "", rows[1][4] / rows[0][4]])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.train", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument(
        "--precision",
        default="fp32",
        help="comma-separated autocast precisions to measure (fp32, bf16), each for both models",
    )
    args = ap.parse_args(argv)
    precisions = [x.strip() for x in args.precision.split(",") if x.strip()]
    if not precisions or any(x not in ("fp32", "bf16") for x in precisions):
        ap.error("--precision takes fp32 and/or bf16 (fp16 autocast needs CUDA)")
    torch.set_num_threads(args.threads)
    config = XLNetConfig.preset(
        args.config, vocab_size=args.vocab, dropout=0.0, mem_len=args.seq // 2, reuse_len=args.seq // 2
    )
    rows: list[list[object]] = []
    ours: dict[tuple[str, str], float] = {}  # (stage, precision) -> our tokens/s
    for precision in precisions:
        for stage, bench in (("pretrain", bench_pretrain), ("fine-tune", bench_finetune)):
            part = bench(config, args.batch, args.seq, args.threads, args.runs, precision)
            ours[stage, precision] = float(part[1][4])
            rows += part
    if "fp32" in precisions and "bf16" in precisions:
        for stage in ("pretrain", "fine-tune"):
            ratio = ours[stage, "bf16"] / ours[stage, "fp32"]
            rows.append([f"{stage}: ours bf16 / ours fp32 (tokens/s)", "", "", "", ratio])
    print(f"Machine: {machine_line(args.threads)}")
    print(
        f"Command: python -m bench.train --config {args.config} --batch {args.batch} --seq {args.seq} "
        f"--threads {args.threads} --runs {args.runs} --precision {args.precision}\n"
    )
    print(markdown_table(["what", "batch", "seq", "p50 ms/step", "tokens/s (or ratio)"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
