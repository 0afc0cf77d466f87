"""One command that proves a GPU machine serves this product: ``python -m bench.gpu_smoke`` (``make gpu-check``).

    python -m bench.gpu_smoke [--checkpoint DIR] [--work DIR] [--requests N] [--json FILE]

1. the stack report (onnxruntime wheels and the providers that really run, TensorRT, CUDA devices, pins);
2. a checkpoint (``--checkpoint``, else a tiny random model with a tokenizer trained on the sample) and
   its ONNX export;
3. a TensorRT engine (``python -m export.trt``, verified against onnxruntime);
4. servers on 127.0.0.1: ``--backend trt``, ``--backend onnx`` on the CUDA provider and on the TensorRT
   provider (engine cache), ``--backend torch --torch-device cuda``; each asked the sample's first
   question ``--requests`` times, and each checked to have run where it was asked (``GET /v1/model``:
   the first onnxruntime provider, or the device), since a server on the CPU would also answer.

It prints the versions, where each server ran and its latencies. A stage whose packages this Python lacks
(a GPU machine that cannot fetch tensorrt or onnxruntime-gpu) is not run and is reported with the missing
packages by name. Exit codes: 0 every stage ran and passed; 1 a stage failed (or ran somewhere else than
asked); 2 no CUDA device (one line); 3 everything that could run passed, but stages were missing packages.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import markdown_table, percentile
from export.stack_report import collect, problems
from harness.server_process import ServerProcess
from qa_core.runtime.gpu import installed_stack
from train.common.sample_data import SAMPLE_CORPUS, SAMPLE_DEV

PROG = "python -m bench.gpu_smoke"
TENSORRT = installed_stack(None).tensorrt_package  # tensorrt-cu13 or tensorrt-cu12, as onnxruntime-gpu
# pip name -> module that proves it is importable here
PACKAGES = {
    "torch": "torch",
    "onnx": "onnx",
    "onnxscript": "onnxscript",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "pydantic-settings": "pydantic_settings",
    "prometheus-client": "prometheus_client",
    TENSORRT: "tensorrt",
    "cuda-bindings": "cuda.bindings",
}
SERVE = ("fastapi", "uvicorn", "pydantic-settings", "prometheus-client")
EXPORT = ("torch", "onnx", "onnxscript")


@dataclass(frozen=True)
class ServerRun:
    """One server to start: its flags, what it must report running on, the packages it needs."""

    flags: tuple[str, ...]
    model: str  # "onnx", "trt" or "checkpoint": which artefact it serves
    runs_on: Callable[[dict[str, Any]], str]  # /v1/model runtime -> where it really ran
    expected: str
    needs: tuple[str, ...]


def first_provider(runtime: dict[str, Any]) -> str:
    return str((runtime.get("providers") or ["?"])[0])


def device(runtime: dict[str, Any]) -> str:
    return str(runtime.get("device", "?"))


SERVERS = {
    "trt backend": ServerRun(
        ("--backend", "trt"), "trt", device, "cuda", (*SERVE, TENSORRT, "cuda-bindings")
    ),
    "onnx + CUDA provider": ServerRun(
        ("--backend", "onnx", "--providers", "cuda"),
        "onnx",
        first_provider,
        "CUDAExecutionProvider",
        (*SERVE, "onnxruntime-gpu"),
    ),
    "onnx + TensorRT provider": ServerRun(
        ("--backend", "onnx", "--providers", "tensorrt"),
        "onnx",
        first_provider,
        "TensorrtExecutionProvider",
        (*SERVE, "onnxruntime-gpu", TENSORRT),
    ),
    "torch on CUDA": ServerRun(
        ("--backend", "torch", "--torch-device", "cuda"), "checkpoint", device, "cuda", (*SERVE, "torch")
    ),
}


def one_line(message: str) -> str:
    """A failure for one table cell: a server's log ends in the exception that stopped it."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else ""


def missing(packages: Sequence[str]) -> list[str]:
    """The packages of ``packages`` this Python cannot import (onnxruntime-gpu: the CUDA provider)."""
    absent = []
    for name in packages:
        if name == "onnxruntime-gpu":
            if importlib.util.find_spec("onnxruntime") is None:
                absent.append(name)
                continue
            import onnxruntime

            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                absent.append(name)
        else:
            try:
                found = importlib.util.find_spec(PACKAGES[name]) is not None
            except ModuleNotFoundError:  # a dotted name whose parent is absent
                found = False
            if not found:
                absent.append(name)
    return absent


def first_question() -> tuple[str, str]:
    paragraph = json.loads(SAMPLE_DEV.read_text())["data"][0]["paragraphs"][0]
    return next(qa["question"] for qa in paragraph["qas"] if qa["answers"]), paragraph["context"]


def make_checkpoint(work: Path) -> Path:
    """A tiny random QA checkpoint (vocabulary trained on the sample)."""
    from harness.tiny_models import tiny_qa_checkpoint
    from train.tokenizer import train_spm

    train_spm([SAMPLE_CORPUS], work / "tokenizer", 2000)
    return tiny_qa_checkpoint(work / "checkpoint", work / "tokenizer", "shallow")


def make_export(work: Path, checkpoint: Path) -> Path:
    """An fp32 ONNX export of ``checkpoint``."""
    from export.onnx.exporter import OnnxExportOptions, export_onnx

    return export_onnx(OnnxExportOptions(checkpoint=checkpoint, out=work / "onnx"), report=print).out


def build_engine(onnx_dir: Path, work: Path) -> Path:
    from export.trt.build import TrtBuildOptions, build_trt

    out = work / "trt"
    cache = work / "timing.cache"
    build_trt(TrtBuildOptions(onnx_dir, out, opt_shape=(4, 384), max_shape=(8, 512), timing_cache=cache))
    return out  # min shape: the graph's shortest


def ask(model: Path, run: ServerRun, work: Path, requests: int) -> dict[str, Any]:
    """Start one server, check where it runs, ask the same question ``requests`` times."""
    question, context = first_question()
    log = work / f"server-{len(list(work.glob('server-*.log')))}.log"
    flags = list(run.flags[2:])
    if "tensorrt" in flags:
        flags += ["--trt-cache-dir", str(work / "ort-trt-cache")]
    # an engine build at the first start takes minutes
    with ServerProcess(
        model, *flags, backend=run.flags[1], log_path=log, ready_timeout_s=900, log_level="info"
    ) as server:
        runtime = httpx.get(server.url + "/v1/model").json()["runtime"]
        ran_on = run.runs_on(runtime)
        if ran_on != run.expected:
            raise RuntimeError(f"asked for {run.expected} but the server runs on {ran_on}")
        latencies, answer = [], None
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for _ in range(requests):
                t = time.perf_counter()
                r = client.post("/v1/answer", json={"question": question, "context": context})
                latencies.append(time.perf_counter() - t)
                r.raise_for_status()
                answer = r.json()["answer"]
    return {
        "runtime": runtime,
        "ran_on": ran_on,
        "answer": answer,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


class Stages:
    """Runs stages in order, recording each result, error or missing packages."""

    def __init__(self) -> None:
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, name: str, needs: Sequence[str], call: Callable[[], Any], after: Sequence[str] = ()) -> Any:
        """Run ``call`` unless packages in ``needs`` are missing or a stage in ``after`` did not pass
        (its missing packages are this stage's too; its failure makes this one fail)."""
        absent = missing(needs)
        for earlier in after:
            absent += [m for m in self.results.get(earlier, {}).get("missing", []) if m not in absent]
        if absent:
            self.results[name] = {"missing": absent}
            return None
        failed = [e for e in after if "error" in self.results.get(e, {})]
        if failed:
            self.results[name] = {"error": f"needs {', '.join(failed)}, which failed"}
            return None
        try:
            value = call()
        except Exception as exc:  # noqa: BLE001 - report every stage, then fail
            self.results[name] = {"error": f"{type(exc).__name__}: {one_line(str(exc))}"}
            return None
        self.results[name] = value if isinstance(value, dict) else {"ok": str(value)}
        return value

    def exit_code(self) -> int:
        if any("error" in r for r in self.results.values()):
            return 1
        return 3 if any("missing" in r for r in self.results.values()) else 0

    def table(self) -> str:
        rows = []
        for name, r in self.results.items():
            if "missing" in r:
                rows.append([name, "NOT RUN", "missing packages: " + ", ".join(r["missing"]), "", ""])
            elif "error" in r:
                rows.append([name, "FAILED", r["error"][:200], "", ""])
            elif "p50_ms" in r:
                p50, p99 = f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}"
                rows.append([name, r["ran_on"], repr(r["answer"])[:40], p50, p99])
            else:
                rows.append([name, "ok", r.get("ok", "")[-60:], "", ""])
        return markdown_table(["stage", "ran on", "answer / note", "p50 ms", "p99 ms"], rows)


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
    if report["cuda_devices"] == 0:
        missing_stack = problems(report, require_gpu=True)
        print(f"{PROG}: error: the GPU stack is incomplete: {'; '.join(missing_stack)}", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="xlnetqa-gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    stages = Stages()
    checkpoint = args.checkpoint or stages.run("checkpoint", ("torch",), lambda: make_checkpoint(work))
    made = [] if args.checkpoint else ["checkpoint"]
    onnx_dir = stages.run("onnx export", EXPORT, lambda: make_export(work, checkpoint), made)
    trt_needs = ("onnx", TENSORRT, "cuda-bindings")
    engine = stages.run("trt build", trt_needs, lambda: build_engine(onnx_dir, work), ["onnx export"])
    models = {
        "onnx": (onnx_dir, ["onnx export"]),
        "trt": (engine, ["trt build"]),
        "checkpoint": (checkpoint, made),
    }
    for name, run in SERVERS.items():
        model, source = models[run.model]
        stages.run(name, run.needs, lambda m=model, r=run: ask(m, r, work, args.requests), source)
    print(stages.table())
    if args.json:
        payload = {"stack": report, **stages.results}
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    return stages.exit_code()


if __name__ == "__main__":
    sys.exit(main())
