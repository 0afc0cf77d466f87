"""``python -m bench.gpu_graphs``: every whole-graph path of one forward on a GPU, side by side in one
run, each against fp32 eager on the same inputs, and where one eager forward's kernel time goes.

Paths, each on the same cast weights and inputs, timed as replays (inputs already on the device, then a
synchronize), with the seconds each took to prepare its shape:

- ours, CUDA graph: the server's ``--torch-cuda-graphs`` bucket (the Triton attention kernel inside);
- ours, CUDA graph, torch attention: the same capture with the attention as torch ops (the kernel's gain);
- ours, compiled + CUDA graph: ``--torch-compile`` (Inductor fuses the projections' bias and GELU,
  residual + LayerNorm and the masks' work around the matrix products; the attention kernel stays one
  operator), recorded into the same kind of graph;
- ours, compiled (max-autotune) + CUDA graph: the same with Inductor's GEMM templates timed per shape
  (``--paths autotuned``: minutes to prepare; not a server flag);
- HF eager and HF ``torch.compile(mode="reduce-overhead")``: transformers' XLNet with the same weights,
  cast the same way (what a user of HF would run).

Agreement at the timed shape: each path's logits against ours in fp32 eager (HF's against the same,
since both compute the same function): the largest absolute difference, and the share of rows whose
best start and best end token are the same. ``--guard`` also runs the attention kernel at a batch past
its 32-bit offsets (xlnet-base at T 384: 608 rows) and checks the last row against that row alone.

    python -m bench.gpu_graphs                              # xlnet-base shape, fp16, 1x384 and 32x384
    python -m bench.gpu_graphs --shapes 1x384 --dtype bf16 --kernels --guard --json FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

PROG = "python -m bench.gpu_graphs"
OURS_GRAPH = "ours, CUDA graph"
OURS_TORCH_ATTENTION = "ours, CUDA graph, torch attention"
OURS_COMPILED = "ours, compiled + CUDA graph"
OURS_AUTOTUNED = "ours, compiled (max-autotune) + CUDA graph"
HF_EAGER = "HF eager"
HF_COMPILED = "HF torch.compile (reduce-overhead)"
# --paths names -> the rows' labels
PATHS = {
    "graph": OURS_GRAPH,
    "graph-torch-attention": OURS_TORCH_ATTENTION,
    "compiled": OURS_COMPILED,
    "autotuned": OURS_AUTOTUNED,
    "hf-eager": HF_EAGER,
    "hf-compiled": HF_COMPILED,
}


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


def ours_runner(model: torch.nn.Module, inputs: dict, path: str) -> tuple[Callable[[], Any], Any]:
    """One bucket of the inputs' shape through the server's ``BucketedRunner``: (replay, outputs)."""
    from qa_core.contract import INPUT_NAMES
    from server.backends.buckets import Bucket, BucketGrid
    from server.backends.torch_graphs import BucketedRunner, CompiledCapture, CudaGraphCapture
    from train.model import triton_attention

    device = torch.device("cuda")
    rows, length = inputs["input_ids"].shape
    capture = (
        CompiledCapture(model, device, 1)
        if path == OURS_COMPILED
        else CompiledCapture(model, device, 1, mode="max-autotune-no-cudagraphs")
        if path == OURS_AUTOTUNED
        else CudaGraphCapture(device)
    )
    grid = BucketGrid((rows,), (length,))
    with triton_attention.kernel(path != OURS_TORCH_ATTENTION):
        runner = BucketedRunner(model, INPUT_NAMES, getattr(model, "names", ()), grid, device, capture)
        runner.prepare()
    slot = runner.slots[Bucket(rows, length)]
    slot.load(inputs)
    return slot.replay, slot.outputs


def hf_runner(hf: torch.nn.Module, inputs: dict, compiled: bool) -> tuple[Callable[[], Any], Any]:
    """transformers' model on device tensors, eager or torch.compile(mode="reduce-overhead")."""
    from bench.latency import HFWrapper
    from qa_core.contract import INPUT_NAMES

    tensors = [torch.from_numpy(inputs[n]).cuda() for n in INPUT_NAMES]
    module: Any = HFWrapper(hf)
    if compiled:
        module = torch.compile(module, mode="reduce-overhead", dynamic=False)
    box: dict[str, Any] = {}

    def run() -> None:
        with torch.inference_mode():
            if compiled:
                torch.compiler.cudagraph_mark_step_begin()
            box["out"] = module(*tensors)

    for _ in range(3):  # compile and record before timing
        run()
    torch.cuda.synchronize()
    return run, box


def agreement(outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> dict[str, float]:
    """The start and end logits (the first two outputs) against the reference's: the largest |difference|
    and the share of rows whose best token is the same."""
    found: dict[str, float] = {}
    for name, got, want in zip(("start", "end"), outputs[:2], reference[:2], strict=True):
        got, want = got.float(), want.float()
        found[f"{name} max |difference|"] = (got - want).abs().max().item()
        found[f"{name} same best token"] = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    return found


def compare_paths(
    model: torch.nn.Module,
    hf: torch.nn.Module | None,
    shape: tuple[int, int],
    vocab: int,
    dtype: str,
    runs: int,
    paths: Sequence[str] = (OURS_GRAPH, OURS_TORCH_ATTENTION, OURS_COMPILED, HF_EAGER, HF_COMPILED),
) -> dict:
    """Every path at one shape: p50/p90 per run, prepare seconds, agreement with ours in fp32 eager."""
    from bench.common import pct, time_runs
    from bench.gpu_paths import cast_model
    from bench.latency import make_inputs
    from qa_core.contract import INPUT_NAMES

    rows, length = shape
    inputs = make_inputs(rows, length, vocab)
    with torch.inference_mode():
        reference = [
            o.float() for o in model.cuda()(*[torch.from_numpy(inputs[n]).cuda() for n in INPUT_NAMES])
        ]
    model.cpu()
    found: dict[str, Any] = {"BxT": f"{rows}x{length}", "dtype": dtype}
    for path in paths:
        if path.startswith("HF") and hf is None:
            continue
        start = time.monotonic()
        try:
            if path.startswith("HF"):
                cast = cast_model(hf, dtype).cuda()
                replay, box = hf_runner(cast, inputs, compiled=path == HF_COMPILED)
                outputs: Callable[[], Any] = lambda box=box: box["out"]  # noqa: E731
            else:
                cast = cast_model(model, dtype).cuda()
                replay, static = ours_runner(cast, inputs, path)
                outputs = lambda static=static: static  # noqa: E731
            prepare_s = time.monotonic() - start
            times = 1000 * time_runs(synchronized(replay), warmup=10, runs=runs)
            found[path] = {
                "p50 ms": pct(times, 50),
                "p90 ms": pct(times, 90),
                "prepare s": prepare_s,
                "windows/s": rows / (pct(times, 50) / 1000),
                **agreement(list(outputs()), reference),
            }
        except Exception as exc:  # one path's failure is its row, not the end of the run
            found[path] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        finally:
            cast = None
            torch.cuda.empty_cache()
    return found


def offset_guard(rows: int = 608, length: int = 384, heads: int = 12) -> dict:
    """The attention kernel at a batch past its 32-bit offsets (fp16, xlnet-base's widths): the last row
    against the same row run alone (a wrapped offset would read another row's, or no, memory)."""
    from train.model import triton_attention

    torch.manual_seed(0)
    device = torch.device("cuda")
    width, dh = 72, 64
    q = torch.randn(rows, length, heads, width, device=device, dtype=torch.float16)
    k = torch.randn_like(q)
    v = torch.randn(rows, length, heads, dh, device=device, dtype=torch.float16)
    distances = torch.randn(rows, heads, length, 2 * length, device=device, dtype=torch.float16)
    slices = triton_attention.batch_slices(rows, (q, k, v, distances))
    out = triton_attention.relative_attention(q, k, v, distances)
    alone = triton_attention.relative_attention(q[-1:], k[-1:], v[-1:], distances[-1:])
    return {
        "shape": f"{rows}x{length}, {heads} heads",
        "largest offset": triton_attention.largest_offset(rows, distances),
        "launches": len(slices),
        "last row max |difference| vs alone": (out[-1:] - alone).abs().max().item(),
    }


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
    ap.add_argument("--shapes", default="1x384,32x384", help="comma-separated BxT")
    ap.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument(
        "--paths",
        default=",".join(p for p in PATHS if p != "autotuned"),
        help=f"comma-separated, of: {', '.join(PATHS)}",
    )
    ap.add_argument(
        "--kernels", action="store_true", help="also profile one eager forward at the first shape"
    )
    ap.add_argument("--guard", action="store_true", help="also run the attention kernel past its offsets")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    names = [p.strip() for p in args.paths.split(",") if p.strip()]
    if unknown := set(names) - set(PATHS):
        ap.error(f"--paths: unknown {', '.join(sorted(unknown))}; of: {', '.join(PATHS)}")
    paths = [PATHS[n] for n in names]
    if not shapes or args.runs < 2:
        ap.error("--shapes needs at least one BxT and --runs at least 2")
    if not torch.cuda.is_available():
        print(f"{PROG}: error: needs a CUDA device (torch {torch.__version__} sees none)", file=sys.stderr)
        return 2

    import transformers

    from train.model import XLNetConfig, XLNetForQuestionAnswering, checkpoint
    from train.model.inference import QAInference

    config = XLNetConfig.preset(args.config, dropout=0.0)
    torch.manual_seed(0)
    ours = XLNetForQuestionAnswering(config, head="simple").eval()
    hf = None
    if any(p.startswith("HF") for p in paths):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="gpu-graphs-") as tmp:
            checkpoint.save(ours, Path(tmp) / "ckpt")
            hf = transformers.XLNetForQuestionAnsweringSimple.from_pretrained(Path(tmp) / "ckpt").eval()
    model = QAInference(ours)
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": {"preset": args.config, "d_model": config.d_model, "n_layer": config.n_layer},
        "rows": [],
    }
    for shape in shapes:
        row = compare_paths(model, hf, shape, config.vocab_size, args.dtype, args.runs, paths)
        report["rows"].append(row)
        for path in paths:
            got = row.get(path, {})
            line = (
                f"p50 {got['p50 ms']:.3f} ms (prepare {got['prepare s']:.1f} s), start max |diff| "
                f"{got['start max |difference|']:.3g}, same best start {got['start same best token']:.3f}"
                if "p50 ms" in got
                else got.get("error", "not run")
            )
            print(f"{row['BxT']} {args.dtype} {path}: {line}", flush=True)
    if args.guard:
        report["offset guard"] = offset_guard()
        print(f"offset guard: {report['offset guard']}", flush=True)
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
