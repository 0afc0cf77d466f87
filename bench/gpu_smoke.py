"""One command that proves a GPU machine serves this product: ``python -m bench.gpu_smoke`` (``make gpu-check``).

    python -m bench.gpu_smoke [--checkpoint DIR] [--work DIR] [--requests N] [--json FILE]

1. the stack report (onnxruntime wheels and providers, TensorRT, CUDA devices, the pinned versions);
2. an ONNX export (of ``--checkpoint``, else a tiny random model with a tokenizer trained on the sample);
3. a TensorRT engine (``python -m export.trt``, verified against onnxruntime);
4. servers on 127.0.0.1: ``--backend trt``, ``--backend onnx`` on the CUDA provider, and on the TensorRT
   provider with an engine cache; each asked the sample's first question ``--requests`` times.

It prints the versions, the providers each server really used (``GET /v1/model``) and latencies, and
exits 0 only if every stage worked; without a GPU stack it says what is missing in one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.common import markdown_table, percentile
from export.stack_report import collect, problems
from server.process import ServerProcess
from train.sample_data import SAMPLE_CORPUS, SAMPLE_DEV

PROG = "python -m bench.gpu_smoke"
SERVERS = {
    "trt backend": ("--backend", "trt"),
    "onnx + CUDA provider": ("--backend", "onnx", "--providers", "CUDAExecutionProvider"),
    "onnx + TensorRT provider": ("--backend", "onnx", "--providers", "TensorrtExecutionProvider"),
}


def first_question() -> tuple[str, str]:
    paragraph = json.loads(SAMPLE_DEV.read_text())["data"][0]["paragraphs"][0]
    return next(qa["question"] for qa in paragraph["qas"] if qa["answers"]), paragraph["context"]


def make_export(work: Path, checkpoint: Path | None) -> Path:
    """An fp32 ONNX export of ``checkpoint``, or of a tiny random model (vocabulary from the sample)."""
    from export.onnx_pipeline import OnnxExportOptions, export_onnx

    if checkpoint is None:
        from export.testing import tiny_qa_checkpoint
        from train.tokenizer import train_spm

        train_spm([SAMPLE_CORPUS], work / "tokenizer", 2000)
        checkpoint = tiny_qa_checkpoint(work / "checkpoint", work / "tokenizer", "shallow")
    result = export_onnx(OnnxExportOptions(checkpoint=checkpoint, out=work / "onnx"), report=print)
    return result.out


def build_engine(onnx_dir: Path, work: Path) -> Path:
    from export.trt import main as trt_main

    out = work / "trt"
    args = ["--onnx", str(onnx_dir), "--out", str(out), "--timing-cache", str(work / "timing.cache")]
    if trt_main([*args, "--opt-shape", "4x384", "--max-shape", "8x512"]) != 0:  # min: the graph's shortest
        raise RuntimeError("python -m export.trt failed (see above)")
    return out


def ask(model: Path, flags: Sequence[str], work: Path, requests: int) -> dict[str, Any]:
    """Start one server, ask the same question ``requests`` times; what it ran on and how fast."""
    question, context = first_question()
    log = work / f"server-{len(list(work.glob('server-*.log')))}.log"
    extra = ("--trt-cache-dir", str(work / "ort-trt-cache")) if "TensorrtExecutionProvider" in flags else ()
    # an engine build at the first start takes minutes
    with ServerProcess(
        model, *flags[2:], *extra, backend=flags[1], log_path=log, ready_timeout_s=900
    ) as server:
        runtime = httpx.get(server.url + "/v1/model").json()["runtime"]
        latencies, answer = [], None
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for _ in range(requests):
                t = time.perf_counter()
                r = client.post("/answer", json={"question": question, "context": context})
                latencies.append(time.perf_counter() - t)
                r.raise_for_status()
                answer = r.json()["answer"]
    return {
        "runtime": runtime,
        "answer": answer,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description="Export, build an engine, serve and ask on an NVIDIA GPU."
    )
    p.add_argument("--checkpoint", type=Path, help="a fine-tuned checkpoint (default: a tiny random model)")
    p.add_argument("--work", type=Path, help="working directory (default: a temporary one)")
    p.add_argument("--requests", type=int, default=50, help="requests per server")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    report = collect()
    print(json.dumps(report, indent=2))
    missing = problems(report, require_gpu=True)
    if missing:
        print(f"{PROG}: error: the GPU stack is incomplete: {'; '.join(missing)}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="xlnetqa-gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"stack": report}
    failed = False
    onnx_dir = engine = None
    try:
        onnx_dir = make_export(work, args.checkpoint)
    except Exception as exc:  # noqa: BLE001 - report every stage, then fail
        results["onnx export"] = {"error": f"{type(exc).__name__}: {exc}"}
        failed = True
    try:
        if onnx_dir is None:
            raise RuntimeError("no ONNX export to build from")
        engine = build_engine(onnx_dir, work)
    except Exception as exc:  # noqa: BLE001 - report every stage, then fail
        results["trt build"] = {"error": str(exc)}
        failed = True
    for name, flags in SERVERS.items():
        model = engine if flags[1] == "trt" else onnx_dir
        if model is None:
            continue
        try:
            results[name] = ask(model, flags, work, args.requests)
        except Exception as exc:  # noqa: BLE001
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            failed = True
    rows = []
    for name in SERVERS:
        r = results.get(name, {"error": "not run"})
        if "error" in r:
            rows.append([name, "FAILED", r["error"][:80], "", ""])
        else:
            used = r["runtime"].get("providers") or [r["runtime"].get("device", "")]
            rows.append(
                [
                    name,
                    ", ".join(map(str, used)),
                    repr(r["answer"])[:40],
                    f"{r['p50_ms']:.2f}",
                    f"{r['p99_ms']:.2f}",
                ]
            )
    print(markdown_table(["server", "ran on", "answer", "p50 ms", "p99 ms"], rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
