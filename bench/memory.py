"""`python -m bench.memory`: the bytes one training step of xlnet-base / xlnet-large holds, lever by lever.

For each shape (random weights, vocab 32000), stage and lever combination it measures one optimizer
step after a first one (so the optimizer state exists): the parameters, the gradients, the optimizer
state (the original's Adam, `--optimizer xlnet`: two fp32 moments per trained parameter), the
activations alive at the end of forward, and the peak of everything through forward, backward and
the update (`train.engine.memory.LiveTensors`; an allocator adds its rounding and fragmentation).
On CPU the step runs under FakeTensorMode: shapes only, nothing allocated, every byte counted.
With `--device cuda` the step is real and torch.cuda.max_memory_allocated is reported beside it;
`--time` adds the median step time (real tensors, on CPU too: then xlnet-large needs over 12 GiB).

Levers: bf16 autocast, activation checkpointing, the bottom layers frozen (the embedding still
trained through them, or frozen as well), and all together. Our step keeps fp32 weights, gradients
and optimizer state under every `--precision` (bf16 and fp16 are autocast), so bf16 cuts
activations only.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.common import machine_line, markdown_table
from train.engine.execution import autocast
from train.engine.memory import LiveTensors, storage_bytes
from train.engine.optim import make_optimizer
from train.model import HEADS, PRESETS, XLNetConfig, XLNetForQuestionAnswering, XLNetLMHeadModel
from train.recipes.finetune import qa_loss
from train.recipes.finetune_setup import freeze
from train.recipes.pretrain import pretrain_loss

PROG = "python -m bench.memory"
UNITS = {"GiB": 2**30, "MiB": 2**20}
STAGES = ("finetune", "pretrain")


@dataclass(frozen=True)
class Lever:
    """One combination of the memory levers."""

    name: str
    precision: str = "fp32"
    checkpointing: bool = False
    frozen: bool = False  # the bottom --freeze-fraction of the layers
    freeze_embeddings: bool = False


def levers(stage: str, frozen: int, n_layer: int, half: str = "bf16") -> list[Lever]:
    """Each lever alone and together; freezing only where it exists (fine-tuning)."""
    k = f"{frozen}/{n_layer} layers"
    rows = [
        Lever("fp32 (baseline)"),
        Lever(f"{half} autocast", precision=half),
        Lever("activation checkpointing", checkpointing=True),
    ]
    if stage == "finetune":
        rows += [
            Lever(f"freeze {k} (embedding trained)", frozen=True),
            Lever(f"freeze {k} + embedding", frozen=True, freeze_embeddings=True),
        ]
    rows.append(Lever(f"{half} + checkpointing", precision=half, checkpointing=True))
    if stage == "finetune":
        rows.append(
            Lever(
                f"{half} + checkpointing + freeze {k} + embedding",
                precision=half,
                checkpointing=True,
                frozen=True,
                freeze_embeddings=True,
            )
        )
    return rows


@dataclass
class Measured:
    trainable: int
    weights: int
    grads: int
    optimizer: int
    activations: int  # alive at the end of forward: what backward needs (and checkpoint's inputs)
    peak: int  # weights + optimizer state + batch + the peak of what the step allocated
    cuda_peak: int | None = None
    ms_per_step: float | None = None

    @property
    def parts(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations


class Step:
    """One model and optimizer, and the step `python -m train.finetune` / `train.pretrain` would take."""

    def __init__(
        self, stage: str, config: XLNetConfig, lever: Lever, frozen: int, batch: int, seq: int, head: str
    ) -> None:
        self.stage, self.lever = stage, lever
        self.model: XLNetForQuestionAnswering | XLNetLMHeadModel
        if stage == "finetune":
            self.model = XLNetForQuestionAnswering(config, head=head)
            freeze(self.model, frozen if lever.frozen else 0, lever.freeze_embeddings)  # as the recipe does
        else:
            self.model = XLNetLMHeadModel(
                config.replace(mem_len=seq // 2, reuse_len=seq // 2, attn_type="bi")
            )
        self.model.train()
        self.model.transformer.activation_checkpointing = lever.checkpointing
        self.optimizer = make_optimizer(self.model, lr=3e-5, layer_decay=0.75 if stage == "finetune" else 1.0)
        self.batch = make_batch(stage, config, batch, seq)

    def device(self) -> torch.device:
        return self.batch["input_ids"].device

    def forward(self) -> torch.Tensor:
        b, precision = self.batch, self.lever.precision
        if self.stage == "pretrain":
            mems = [b[f"mem{i}"] for i in range(self.model.config.n_layer)]
            return pretrain_loss(self.model, b, mems, precision)[0]
        with autocast(precision, self.device()):
            return qa_loss(self.model, b)

    def update(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self) -> None:
        self.forward().float().backward()
        self.update()

    def measure(self) -> Measured:
        """A first step (the optimizer state appears), then the measured one."""
        self.run()
        params = list(self.model.parameters())
        state = [t for s in self.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        held = storage_bytes([*params, *state, *self.batch.values()])
        cuda = self.device().type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        tracker = LiveTensors()
        with tracker:
            loss = self.forward()
            activations = tracker.current
            loss.float().backward()
            del loss
            grads = storage_bytes(p.grad for p in params)
            self.update()
        return Measured(
            trainable=sum(p.numel() for p in params if p.requires_grad),
            weights=storage_bytes(params),
            grads=grads,
            optimizer=storage_bytes(state),
            activations=activations,
            peak=held + tracker.peak,
            cuda_peak=torch.cuda.max_memory_allocated() if cuda else None,
        )

    def time(self, runs: int) -> float:
        """Median milliseconds per step over `runs` steps (after the measured ones)."""
        sync = torch.cuda.synchronize if self.device().type == "cuda" else (lambda: None)
        times = []
        for _ in range(runs):
            sync()
            start = time.perf_counter()
            self.run()
            sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3


def make_batch(stage: str, config: XLNetConfig, b: int, t: int) -> dict[str, torch.Tensor]:
    """A batch of the right shapes (the values do not change what a step holds): `P <sep> Q <sep> <cls>`
    windows with labels, or pretraining's permutation masks, t // 6 targets and t // 2 tokens of memory."""
    long = torch.long
    if stage == "finetune":
        token_type_ids = torch.zeros(b, t, dtype=long)
        token_type_ids[:, -1] = 2  # <cls> last
        p_mask = torch.zeros(b, t, dtype=long)
        p_mask[:, t // 2 : -1] = 1  # the question and separators are not answers
        return {
            "input_ids": torch.full((b, t), 9, dtype=long),
            "token_type_ids": token_type_ids,
            "attention_mask": torch.ones(b, t, dtype=long),
            "p_mask": p_mask,
            "cls_index": torch.full((b,), t - 1, dtype=long),
            "start_positions": torch.zeros(b, dtype=long),
            "end_positions": torch.zeros(b, dtype=long),
            "is_impossible": torch.zeros(b),
        }
    p = max(1, t // 6)
    batch = {
        "input_ids": torch.full((b, t), 9, dtype=long),
        "token_type_ids": torch.zeros(b, t, dtype=long),
        "perm_mask": torch.zeros(b, t, t),
        "target_mapping": torch.eye(p, t).expand(b, p, t).contiguous(),
        "target_ids": torch.full((b, p), 9, dtype=long),
        "target_weights": torch.ones(b, p),
    }
    for i in range(config.n_layer):
        batch[f"mem{i}"] = torch.zeros(t // 2, b, config.d_model)
    return batch


def measure(stage: str, config: XLNetConfig, lever: Lever, frozen: int, args: argparse.Namespace) -> Measured:
    """Fake tensors on CPU (unless --time), real ones on CUDA."""
    device = torch.device(args.device)
    fake = device.type == "cpu" and not args.time
    with FakeTensorMode() if fake else contextlib.nullcontext(), torch.device(device):
        step = Step(stage, config, lever, frozen, args.batch, args.seq, args.head)
        measured = step.measure()
        if args.time:
            measured.ms_per_step = step.time(args.runs)
    return measured


def in_unit(n: int | None, unit: str) -> str:
    return "" if n is None else f"{n / UNITS[unit]:.2f}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument(
        "--presets", default="base,large", help="comma-separated model shapes (train.model PRESETS)"
    )
    ap.add_argument("--stages", default="finetune", help="comma-separated: finetune, pretrain")
    ap.add_argument("--batch", type=int, default=4, help="micro-batch (windows or sequences)")
    ap.add_argument(
        "--seq", type=int, default=384, help="tokens per window (pretraining: plus seq/2 of memory)"
    )
    ap.add_argument("--head", choices=HEADS, default="beam", help="fine-tuning head")
    ap.add_argument(
        "--freeze-fraction",
        type=float,
        default=10 / 24,
        help="share of the bottom layers the freezing levers freeze, rounded (default 10/24: 10 of 24, 5 of 12)",
    )
    ap.add_argument("--half", choices=["bf16", "fp16"], default="bf16", help="the autocast levers' precision")
    ap.add_argument(
        "--no-half",
        action="store_true",
        help="leave out the autocast levers (a CPU without native bf16/fp16 emulates them: slow to --time)",
    )
    ap.add_argument("--unit", choices=sorted(UNITS), default="GiB")
    ap.add_argument("--device", default="cpu", help="cpu (fake tensors: nothing allocated) or cuda")
    ap.add_argument("--time", action="store_true", help="also time real steps (on CPU: allocates everything)")
    ap.add_argument("--runs", type=int, default=5, help="timed steps per row with --time")
    args = ap.parse_args(argv)
    args.preset_list = [p for p in args.presets.split(",") if p]
    args.stage_list = [s for s in args.stages.split(",") if s]
    if not args.preset_list or any(p not in PRESETS for p in args.preset_list):
        ap.error(f"--presets takes some of {', '.join(PRESETS)}, got {args.presets!r}")
    if not args.stage_list or any(s not in STAGES for s in args.stage_list):
        ap.error(f"--stages takes {' and/or '.join(STAGES)}, got {args.stages!r}")
    if args.batch < 1 or args.seq < 8 or args.runs < 1:
        ap.error("--batch and --runs must be at least 1, --seq at least 8")
    if not 0.0 <= args.freeze_fraction < 1.0:
        ap.error(f"--freeze-fraction must be in [0, 1), got {args.freeze_fraction}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    if args.half == "fp16" and not args.device.startswith("cuda"):
        ap.error("--half fp16 needs --device cuda (CPU autocast is bf16)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cuda, timed = args.device.startswith("cuda"), args.time
    header = ["model", "stage", "lever", "trained M", "weights", "grads", "optimizer", "activations"]
    header += (
        ["sum of the 4", "peak"] + (["cuda max allocated"] if cuda else []) + (["ms/step"] if timed else [])
    )
    rows: list[list[object]] = []
    for preset in args.preset_list:
        config = XLNetConfig.preset(preset)
        frozen = round(args.freeze_fraction * config.n_layer)
        for stage in args.stage_list:
            for lever in levers(stage, frozen, config.n_layer, args.half):
                if args.no_half and lever.precision != "fp32":
                    continue
                m = measure(stage, config, lever, frozen, args)
                row: list[object] = [f"xlnet-{preset}", stage, lever.name, f"{m.trainable / 1e6:.1f}"]
                sizes = (m.weights, m.grads, m.optimizer, m.activations, m.parts, m.peak)
                row += [in_unit(v, args.unit) for v in sizes]
                row += [in_unit(m.cuda_peak, args.unit)] if cuda else []
                row += [f"{m.ms_per_step:.0f}"] if m.ms_per_step is not None else []
                rows.append(row)
                print(" | ".join(str(v) for v in row), file=sys.stderr, flush=True)
    how = "real tensors" if cuda or timed else "FakeTensorMode: counted, nothing allocated"
    print(f"\nMachine: {machine_line(torch.get_num_threads())}; device {args.device} ({how})")
    print(
        f"Command: {PROG} --presets {args.presets} --stages {args.stages} --batch {args.batch} --seq {args.seq} "
        f"--head {args.head} --freeze-fraction {args.freeze_fraction:.4g} --half {args.half} --unit {args.unit} "
        f"--device {args.device}"
        + (" --no-half" if args.no_half else "")
        + (f" --time --runs {args.runs}" if timed else "")
    )
    print(
        f"{args.unit}; micro-batch {args.batch} x {args.seq} tokens, dropout 0.1; optimizer: the original's "
        "Adam (2 fp32 moments); activations: alive at the end of forward; peak: the most alive at once over "
        "forward, backward and the update, weights, optimizer state and batch included\n"
    )
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
