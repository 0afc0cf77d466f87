"""``python -m bench.gpu_graphs``: the two whole-graph torch paths on a GPU, side by side, and where one
forward's kernel time goes.

The server replays one recorded CUDA graph per padding bucket (``--torch-cuda-graphs``); the other
candidate is ``torch.compile(mode="reduce-overhead")`` (``--torch-compile``: inductor's fused kernels,
recorded as graphs by torch). Both run here through the server's own ``BucketedRunner`` with one bucket
of the measured shape, on the same cast weights, and are timed as replays (inputs already in the static
buffers, then a synchronize), with the time each takes to prepare its bucket and the largest difference
between their outputs. ``--kernels`` adds torch's profiler over one eager forward: how many kernels it
launches, their summed device time (what a replay cannot go below without fusing), and the top ops.

    python -m bench.gpu_graphs                              # xlnet-base shape, fp16, 1x384 and 8x384
    python -m bench.gpu_graphs --shapes 1x384 --dtype bf16 --kernels --json FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

PROG = "python -m bench.gpu_graphs"
CAPTURES = ("cuda-graphs", "compile")


def parse_shape(text: str) -> tuple[int, int]:
    rows, _, length = text.partition("x")
    if not (rows.isdigit() and length.isdigit()) or int(rows) < 1 or int(length) < 8:
        raise argparse.ArgumentTypeError(f"a shape is BxT (e.g. 1x384), got {text!r}")
    return int(rows), int(length)


def synchronized(replay: Any) -> Any:
    """``replay`` ending in a synchronize, so the kernels are timed, not their launch."""

    def run() -> None:
        replay()
        torch.cuda.synchronize()

    return run


def compare_captures(
    model: torch.nn.Module, shape: tuple[int, int], vocab: int, dtype: str, runs: int
) -> dict:
    """Both captures of one bucket of ``shape``: p50/p90 per replay, prepare seconds, max |difference|."""
    from bench.common import pct, time_runs
    from bench.gpu_paths import cast_model
    from bench.latency import make_inputs
    from qa_core.contract import INPUT_NAMES
    from server.backends.buckets import Bucket, BucketGrid
    from server.backends.torch_graphs import BucketedRunner, CompiledCapture, CudaGraphCapture, fill

    device = torch.device("cuda")
    rows, length = shape
    feeds = make_inputs(rows, length, vocab)
    found: dict[str, Any] = {"BxT": f"{rows}x{length}", "dtype": dtype}
    outputs = {}
    for name in CAPTURES:
        cast = cast_model(model, dtype).to(device)
        start = time.monotonic()
        capture = CudaGraphCapture(device) if name == "cuda-graphs" else CompiledCapture(cast)
        grid = BucketGrid((rows,), (length,))
        runner = BucketedRunner(cast, INPUT_NAMES, getattr(cast, "names", ()), grid, device, capture)
        runner.prepare()
        prepare_s = time.monotonic() - start
        slot = runner.slots[Bucket(rows, length)]
        fill(slot.inputs, feeds)
        times = 1000 * time_runs(synchronized(slot.replay), warmup=10, runs=runs)
        outputs[name] = [o.float().clone() for o in slot.outputs]
        found[name] = {
            "p50 ms": pct(times, 50),
            "p90 ms": pct(times, 90),
            "prepare s": prepare_s,
        }
        del runner, cast
        torch.cuda.empty_cache()
    pairs = zip(outputs["cuda-graphs"], outputs["compile"], strict=True)
    found["max |difference|"] = max((a - b).abs().max().item() for a, b in pairs)
    return found


def kernel_profile(model: torch.nn.Module, shape: tuple[int, int], vocab: int, dtype: str) -> dict:
    """One eager forward under torch's profiler: kernel count, summed kernel time, the top ops."""
    from torch.profiler import ProfilerActivity, profile

    from bench.gpu_paths import cast_model
    from bench.latency import make_inputs
    from qa_core.contract import INPUT_NAMES

    device = torch.device("cuda")
    cast = cast_model(model, dtype).to(device)
    feeds = make_inputs(*shape, vocab)
    inputs = [torch.from_numpy(feeds[n]).to(device) for n in INPUT_NAMES]
    with torch.inference_mode():
        for _ in range(3):
            cast(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            cast(*inputs)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.time_range.elapsed_us() for e in kernels)
    ops = [a for a in prof.key_averages() if a.key.startswith("aten::") and a.self_device_time_total > 0]
    ops.sort(key=lambda a: a.self_device_time_total, reverse=True)
    return {
        "BxT": f"{shape[0]}x{shape[1]}",
        "dtype": dtype,
        "kernels per forward": len(kernels),
        "summed kernel ms": total_us / 1000,
        "top ops": [
            {
                "op": a.key,
                "calls": a.count,
                "device ms": a.self_device_time_total / 1000,
                "share": a.self_device_time_total / max(total_us, 1e-9),
            }
            for a in ops[:12]
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--config", default="base", help="model preset (random weights)")
    ap.add_argument("--shapes", default="1x384,8x384", help="comma-separated BxT")
    ap.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument(
        "--kernels", action="store_true", help="also profile one eager forward at the first shape"
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    if not shapes or args.runs < 2:
        ap.error("--shapes needs at least one BxT and --runs at least 2")
    if not torch.cuda.is_available():
        print(f"{PROG}: error: needs a CUDA device (torch {torch.__version__} sees none)", file=sys.stderr)
        return 2

    from train.model import XLNetConfig, XLNetForQuestionAnswering
    from train.model.inference import QAInference

    config = XLNetConfig.preset(args.config, dropout=0.0)
    torch.manual_seed(0)
    model = QAInference(XLNetForQuestionAnswering(config, head="simple").eval())
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    report["captures"] = []
    for shape in shapes:
        row = compare_captures(model, shape, config.vocab_size, args.dtype, args.runs)
        report["captures"].append(row)
        print(
            f"{row['BxT']} {args.dtype}: "
            + "; ".join(
                f"{n} p50 {row[n]['p50 ms']:.3f} ms (prepare {row[n]['prepare s']:.1f} s)" for n in CAPTURES
            )
            + f"; max |difference| {row['max |difference|']:.3g}",
            flush=True,
        )
    if args.kernels:
        found = kernel_profile(model, shapes[0], config.vocab_size, args.dtype)
        report["kernels"] = found
        print(
            f"{found['BxT']} eager: {found['kernels per forward']} kernels, "
            f"{found['summed kernel ms']:.3f} ms of kernel time"
        )
        for op in found["top ops"]:
            print(f"  {op['op']:<28} {op['calls']:>4} calls {op['device ms']:.3f} ms {op['share']:.1%}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
