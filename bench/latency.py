"""`python -m bench.latency`: inference latency of the same weights through every path, side by side.

(a) HF transformers eager (the reference), (b) HF's model through `torch.onnx.export` + onnxruntime,
(c) our torch backend (`QAInference`, eager), (d) our ONNX fp32, (e) our ONNX int8, (f) TensorRT when
present; on a GPU (`--device cuda`) also (g) ours in fp16 and bf16 weights, eager and replayed as one
recorded CUDA graph (the server's `--torch-cuda-graphs` runner), and (h) our fp32 and fp16 exports on
onnxruntime's CUDA provider (`bench.gpu_paths`). Batch 1 and 8, sequence 128 and 384 (xlnet-base shape
by default, random weights), warm-up then >= 20 runs, p50/p90, GFLOP/s of each model's own counted work
(`bench.common.counted_flops`) and every figure as a ratio to
(a) from the same run. Threads are pinned (torch.set_num_threads, ORT intra_op_num_threads).
`--realistic` adds the shared dev questions at their true lengths (one window each, no padding to max),
answered one by one. `--json FILE` writes the rows and the paths skipped, with why.

HF's graph does not survive dynamic shapes (its exported constants are shape-specialised: wrong
numbers at any other length), so (b) is exported once per measured shape; ours is exported once.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers

from bench.common import REFERENCE_PATH, counted_flops, machine_line, markdown_table, pct, time_runs
from bench.gpu_paths import (
    Skipped,
    cast_model,
    eager_runner,
    graph_runner,
    ort_bound_runner,
    ort_cuda_runner,
    served_graph_runner,
)
from export.onnx.exporter import OnnxExportOptions, VerificationFailed, export_onnx
from qa_core.contract import INPUT_NAMES
from qa_core.runtime.sessions import session
from train.common.cli import to_stderr
from train.common.sample_data import SAMPLE_CORPUS, SAMPLE_DEV
from train.model import XLNetConfig, XLNetForQuestionAnswering, checkpoint
from train.model.inference import QAInference


def make_inputs(b: int, t: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(9, vocab, (b, t), dtype=np.int64)
    types = np.zeros((b, t), dtype=np.int64)
    types[:, int(t * 0.85) :] = 1
    types[:, -1] = 2
    return {"input_ids": ids, "attention_mask": np.ones((b, t), dtype=np.int64), "token_type_ids": types}


class HFWrapper(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask.float(),
            token_type_ids=token_type_ids,
            use_mems=False,
            return_dict=True,
        )
        return out.start_logits, out.end_logits


def ort_session(model_bytes_or_path, threads: int):
    """onnxruntime's defaults but for pinned threads: how a user would run HF's exported graph."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model_bytes_or_path, so, providers=["CPUExecutionProvider"])


def hf_onnx_runner(hf, feeds: dict[str, np.ndarray], threads: int) -> Callable[[], object]:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            HFWrapper(hf),
            tuple(torch.from_numpy(feeds[n]) for n in INPUT_NAMES),
            buf,
            input_names=list(INPUT_NAMES),
            output_names=["start_logits", "end_logits"],
            opset_version=17,
            dynamo=False,
        )
    sess = ort_session(buf.getvalue(), threads)
    return lambda: sess.run(None, feeds)


def export_ours(ckpt: Path, out: Path, precision: str) -> Path | None:
    """Our exporter (verification on); returns the model file, or None if that export does not verify."""
    options = OnnxExportOptions(checkpoint=ckpt, out=out, precision=precision)
    try:
        return export_onnx(options, report=print, warn=to_stderr).model_path
    except VerificationFailed as exc:
        print(f"our {precision} export does not verify: {exc}", file=sys.stderr)
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="base", help="model preset (random weights)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="1x128,1x384,8x128,8x384", help="BxT list")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma-separated paths to skip: a,b,c,d,e,f,g,h")
    ap.add_argument(
        "--paths",
        help="comma-separated paths to run (default: a-f on the CPU; a, c, g, h on CUDA, where the CPU "
        "onnxruntime paths are not what a GPU run compares); g on the CPU is a dry run of its code path",
    )
    ap.add_argument("--json", type=Path, help="also write the rows and the skipped paths here")
    ap.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda[:N]: the torch paths (a) and (c) on that GPU, in fp32 and under bf16 autocast, "
        "(g) and (h) (the CPU onnxruntime paths are skipped there)",
    )
    ap.add_argument(
        "--realistic", type=int, default=0, help="also time N dev questions at their true window lengths"
    )
    ap.add_argument(
        "--realistic-dev",
        type=Path,
        default=SAMPLE_DEV,
        help="SQuAD file the --realistic questions come from (e.g. ../shared/data/squad2/dev-v2.0.cs224n-13.json)",
    )
    ap.add_argument(
        "--realistic-text",
        type=Path,
        default=SAMPLE_CORPUS,
        help="text the --realistic tokenizer is trained on when no --spm (not the dev questions)",
    )
    ap.add_argument(
        "--spm",
        type=Path,
        help="sentencepiece model for --realistic lengths (e.g. xlnet-base-cased's spiece.model); "
        "default: one trained here on the pretraining contexts",
    )
    args = ap.parse_args(argv)
    if args.realistic < 0:
        ap.error("--realistic must be >= 0")
    if args.spm is not None and not args.spm.exists():
        ap.error(f"--spm {args.spm} does not exist")
    from server.backends.torch import torch_device_problem

    if problem := torch_device_problem(args.device, flag="--device"):
        ap.error(problem)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    default_paths = "a,c,g,h" if device.type == "cuda" else "a,b,c,d,e,f"
    wanted = {p.strip() for p in (args.paths or default_paths).split(",") if p.strip()}
    if unknown := wanted - set("abcdefgh"):
        ap.error(f"--paths: unknown path(s) {','.join(sorted(unknown))}; use letters a-h")
    skip = set("abcdefgh") - wanted | set(args.skip.split(","))
    if device.type == "cuda":
        print(
            "on CUDA: the CPU onnxruntime paths (b), (d), (e), (f) are not run; (a) and (c) in fp32 and bf16 autocast"
        )
    skipped: dict[str, str] = {}
    config = XLNetConfig.preset(args.config, vocab_size=args.vocab, dropout=0.0)
    torch.manual_seed(0)
    ours = XLNetForQuestionAnswering(config, head="simple").eval()
    tmp = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    # The exporter ships a tokenizer with the model; any spm will do for timing.
    from qa_core.tokenizer import XLNetTokenizer
    from train.tokenizer import train_spm

    sample = SAMPLE_CORPUS
    train_spm([sample], tmp / "tok", 2000)
    checkpoint.save(ours, tmp / "ckpt", tokenizer=XLNetTokenizer.from_dir(tmp / "tok"))
    hf = transformers.XLNetForQuestionAnsweringSimple.from_pretrained(tmp / "ckpt").eval()
    runners: dict[str, Callable[[dict[str, np.ndarray]], Callable[[], object]]] = {}
    inference = QAInference(ours)

    hf.to(device)
    inference.to(device)

    def torch_runner(module, autocast: torch.dtype | None = None):
        def make(feeds):
            tensors = tuple(torch.from_numpy(feeds[n]).to(device) for n in INPUT_NAMES)

            def run():
                with (
                    torch.inference_mode(),
                    torch.autocast(device.type, autocast or torch.float32, enabled=bool(autocast)),
                ):
                    out = module(*tensors)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # the kernels are timed, not their launch
                return out

            return run

        return make

    if "a" not in skip:
        runners[REFERENCE_PATH] = torch_runner(HFWrapper(hf))
    if "b" not in skip:
        runners["(b) HF -> ONNX -> ORT"] = lambda feeds: hf_onnx_runner(hf, feeds, args.threads)
    if "c" not in skip:
        runners["(c) ours torch eager"] = torch_runner(inference)
    if device.type == "cuda":
        if "a" not in skip:
            runners["(a) HF eager, bf16 autocast"] = torch_runner(HFWrapper(hf), torch.bfloat16)
        if "c" not in skip:
            runners["(c) ours torch eager, bf16 autocast"] = torch_runner(inference, torch.bfloat16)
    if "g" not in skip:
        for dtype in ("fp16", "bf16"):
            cast = cast_model(inference, dtype)
            runners[f"(g) ours {dtype} eager"] = eager_runner(cast, device)
            graph = "CUDA graph" if device.type == "cuda" else "bucketed, eager replay (CPU dry run)"
            runners[f"(g) ours {dtype} {graph}"] = graph_runner(cast, device)
            runners[f"(g) ours {dtype} {graph}, served (BucketedRunner.run)"] = served_graph_runner(
                cast, device
            )
            if device.type == "cuda":  # the Triton attention kernel's own gain, same capture otherwise
                runners[f"(g) ours {dtype} CUDA graph, torch attention"] = graph_runner(cast, device, False)
    exports: dict[str, Path | None] = {}

    def exported(precision: str) -> Path | None:
        if precision not in exports:
            exports[precision] = export_ours(tmp / "ckpt", tmp / f"onnx-{precision}", precision)
        return exports[precision]

    for precision in ("fp32", "fp16") if "h" not in skip else ():
        name = f"(h) ours ONNX {precision} on onnxruntime CUDA"
        path = exported(precision)
        try:
            if path is None:
                raise Skipped(f"our {precision} export does not verify")
            runners[name] = ort_cuda_runner(path.parent, device.index or 0)
        except Skipped as exc:
            skipped[name] = str(exc)
            print(f"{name}: skipped: {exc}")
        if path is not None:  # the session is made per shape, so a refusal skips at that row
            runners[f"{name}, IO binding"] = ort_bound_runner(path.parent, device, cuda_graph=False)
            if device.type == "cuda":
                runners[f"{name}, IO binding + CUDA graph"] = ort_bound_runner(
                    path.parent, device, cuda_graph=True
                )
    for key, precision in (("d", "fp32"), ("e", "int8")):
        if key in skip:
            continue
        path = exported(precision)
        if path is None:
            print(f"({key}) ours ONNX {precision}: does not verify, skipped")
            continue
        sess = session(path, threads=args.threads, level="all")  # the server's settings
        runners[f"({key}) ours ONNX {precision}"] = lambda feeds, sess=sess: lambda: sess.run(None, feeds)
    if "f" not in skip:
        try:
            import tensorrt  # noqa: F401

            if torch.cuda.is_available():
                print(
                    "(f) TensorRT: available; build with `python -m export.trt` and time with bench.latency --trt"
                )
        except ImportError:
            print("(f) TensorRT: not installed on this machine (no NVIDIA GPU), skipped")

    rows = []
    flop_counts: dict[str, dict[str, float]] = {}
    for shape in args.shapes.split(","):
        b, t = (int(x) for x in shape.lower().split("x"))
        feeds = make_inputs(b, t, args.vocab)
        tensors = tuple(torch.from_numpy(feeds[n]).to(device) for n in INPUT_NAMES)
        flops = {"HF": counted_flops(HFWrapper(hf), *tensors), "ours": counted_flops(inference, *tensors)}
        flop_counts[f"{b}x{t}"] = flops
        ref_p50 = None
        for name, make in runners.items():
            try:
                run = make(feeds)
            except Skipped as exc:  # a path that can only say so at its first shape (a session per shape)
                skipped[f"{name} {b}x{t}"] = str(exc)
                print(f"{name} {b}x{t}: skipped: {exc}")
                continue
            times = time_runs(run, warmup=args.warmup, runs=args.runs)
            p50, p90 = pct(times, 50), pct(times, 90)
            if name == REFERENCE_PATH:  # fp32 eager; its bf16 autocast row is another path
                ref_p50 = p50
            speedup = ref_p50 / p50 if ref_p50 else float("nan")
            work = flops["HF"] if name.startswith(("(a)", "(b)")) else flops["ours"]
            rows.append([name, f"{b}x{t}", p50 * 1e3, p90 * 1e3, work / p50 / 1e9, speedup])
            print(f"  {name} {b}x{t}: p50 {p50 * 1e3:.1f} ms", flush=True)
    header = ["path", "BxT", "p50 ms", "p90 ms", "GFLOP/s (own count)", "speed-up vs (a)"]
    print(f"\nMachine: {machine_line(args.threads)}")
    if device.type == "cuda":
        print(
            f"GPU: {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}, TF32 matmul {torch.backends.cuda.matmul.allow_tf32}"
        )
    counts = ", ".join(
        f"{shape}: HF {c['HF'] / 1e9:.3g}, ours {c['ours'] / 1e9:.3g}" for shape, c in flop_counts.items()
    )
    print(
        f"Model: {args.config} preset (d_model {config.d_model}, {config.n_layer} layers), random weights; "
        f"GFLOP per forward as torch counts each model's products ({counts})\n"
    )
    print(markdown_table(header, rows))
    if args.json:
        record = {
            "machine": machine_line(args.threads),
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "model": {"preset": args.config, "d_model": config.d_model, "n_layer": config.n_layer},
            "rows": [dict(zip(header, row, strict=True)) for row in rows],
            "flops_counted": flop_counts,
            "skipped": skipped,
        }
        args.json.write_text(json.dumps(record, indent=2))
    if args.realistic:
        from bench.realistic import realistic_table

        print()
        print(
            realistic_table(
                runners, args.realistic, args.spm, tmp, config, args.realistic_dev, args.realistic_text
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
