"""The stages of ``python -m bench.gpu_run stages``: each one measurement or check on a lent GPU machine,
run as a child process (a crash or a hang is that stage's result, not the end of the run), each writing
``STAGE.json`` (what it found, or why it did not run) and ``STAGE.log`` (everything it printed) into
the output directory. ``report`` merges the JSON of any number of such directories (one per run) into
``summary.json`` and ``summary.md``, the tables BENCHMARKS.md takes.

The children get ``PYTHONPATH`` = the target directory of the carried wheels, then this checkout: the
carried onnxruntime-gpu and server packages go first, torch and the NVIDIA libraries stay the machine's.
Checkpoints and exports are made once into the work directory, which stays between runs on a warm
machine.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import REFERENCE_PATH, markdown_table
from bench.wheel_parts import PartsError, find_manifest, install, part_problems

REPO = Path(__file__).resolve().parents[1]
# bench.serve configurations per stage: name -> (backend, model kind, server flags on CUDA)
SERVE_TORCH = {
    "torch fp32 eager": ("torch", "checkpoint", "--torch-device {device}"),
    "torch fp16 CUDA graphs": (
        "torch",
        "checkpoint",
        "--torch-device {device} --torch-dtype fp16 --torch-cuda-graphs",
    ),
    "torch bf16 CUDA graphs": (
        "torch",
        "checkpoint",
        "--torch-device {device} --torch-dtype bf16 --torch-cuda-graphs",
    ),
}
SERVE_ORT = {"onnx fp32 CUDA provider": ("onnx", "onnx-fp32", "--providers cuda")}


@dataclass
class StageContext:
    """Where results and intermediate files go, and the sizes measured."""

    out: Path
    work: Path
    target: Path
    parts: Path
    device: str = "cuda"
    preset: str = "base"
    shapes: str = "1x384,8x384,32x384"
    runs: int = 20
    warmup: int = 3
    clients: str = "1,16"
    seconds: float = 5.0
    max_batch_size: int = 16
    python: str = sys.executable

    def env(self) -> dict[str, str]:
        paths = [str(self.target)] if self.target.is_dir() else []
        paths += [str(REPO), os.environ.get("PYTHONPATH", "")]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "PYTHONUNBUFFERED": "1"}


def run_child(ctx: StageContext, stage: str, cmd: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run ``cmd`` (appending its output to STAGE.log); its exit code, seconds and last lines."""
    start = time.monotonic()
    with (ctx.out / f"{stage}.log").open("a") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        try:
            proc = subprocess.run(
                cmd,
                cwd=REPO,
                env=ctx.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    lines = (ctx.out / f"{stage}.log").read_text(errors="replace").strip().splitlines()
    return {
        "rc": rc,
        "seconds": round(time.monotonic() - start, 1),
        "tail": lines[-12:],
        "timed_out": rc is None,
    }


# The module each stage runs (tests/test_gpu_run.py imports the ones before ``install`` without the
# server's packages).
STAGE_MODULES = {
    "probe": "bench.gpu_run",
    "latency-torch": "bench.latency",
    "latency-ort": "bench.latency",
    "memory": "bench.memory",
    "graphs": "bench.gpu_graphs",
    "serve-e2e": "bench.serve",
    "serve-torch": "bench.serve",
    "serve-ort": "bench.serve",
}


def python_module(ctx: StageContext, module: str, *args: str) -> list[str]:
    return [ctx.python, "-m", module, *args]


# ---- the stages --------------------------------------------------------------------------------------------


def probe(ctx: StageContext) -> dict[str, Any]:
    """What this machine has: Python, torch and its CUDA, the GPU, driver, packages, the stack report."""
    result = run_child(
        ctx,
        "probe",
        python_module(ctx, STAGE_MODULES["probe"], "facts", "--json", str(ctx.work / "facts.json")),
        300,
    )
    facts = json.loads((ctx.work / "facts.json").read_text()) if (ctx.work / "facts.json").is_file() else None
    return {"facts": facts, **({} if facts else {"error": result})}


def latency(ctx: StageContext, stage: str, paths: str) -> dict[str, Any]:
    """bench.latency on this device for ``paths``."""
    out = ctx.work / f"{stage}.json"
    out.unlink(missing_ok=True)
    args = ["--device", ctx.device, "--config", ctx.preset, "--shapes", ctx.shapes, "--paths", paths]
    args += ["--runs", str(ctx.runs), "--warmup", str(ctx.warmup), "--json", str(out)]
    result = run_child(ctx, stage, python_module(ctx, STAGE_MODULES[stage], *args), 900)
    return json.loads(out.read_text()) if out.is_file() else {"error": result}


def checkpoint(ctx: StageContext) -> Path:
    """A random QA checkpoint of the preset's shape (vocabulary: 2000 pieces trained on the sample)."""
    from harness.tiny_models import tiny_qa_checkpoint
    from train.common.sample_data import SAMPLE_CORPUS
    from train.model.config import PRESETS
    from train.tokenizer import train_spm

    directory = ctx.work / f"checkpoint-{ctx.preset}"
    if not (directory / "model.safetensors").is_file():
        train_spm([SAMPLE_CORPUS], ctx.work / "tokenizer", 2000)
        shape = {k: v for k, v in PRESETS[ctx.preset].items() if k != "vocab_size"}
        tiny_qa_checkpoint(directory, ctx.work / "tokenizer", "shallow", **{**shape, "dropout": 0.0})
    return directory


def onnx_export(ctx: StageContext, stage: str, model: Path) -> Path:
    """Our fp32 export of ``model`` (made once)."""
    out = ctx.work / f"onnx-fp32-{ctx.preset}"
    if not (out / "export.json").is_file():
        run_child(
            ctx, stage, python_module(ctx, "export.onnx", "--checkpoint", str(model), "--out", str(out)), 900
        )
    return out


def serve(ctx: StageContext, stage: str, configs: dict[str, tuple[str, str, str]]) -> dict[str, Any]:
    """bench.serve per configuration: req/s, p50 and p99 per request, at each client count."""
    ckpt = checkpoint(ctx)
    results: dict[str, Any] = {}
    for name, (backend, kind, flags) in configs.items():
        model = ckpt if kind == "checkpoint" else onnx_export(ctx, stage, ckpt)
        out = ctx.work / f"serve-{name.replace(' ', '-')}.json"
        results[name] = bench_serve(
            ctx, stage, model, backend, flags.format(device=ctx.device), out, ["--skip-overhead"], 600
        )
    return results


def bench_serve(
    ctx: StageContext,
    stage: str,
    model: Path,
    backend: str,
    server_flags: str,
    out: Path,
    extra: Sequence[str],
    timeout_s: float,
) -> dict[str, Any]:
    """One bench.serve run (batched, closed-loop clients at ``ctx.clients``) against ``model``: its JSON,
    or the child's exit and last lines when it wrote none."""
    out.unlink(missing_ok=True)
    args = ["--model", str(model), "--backend", backend, f"--server-args={server_flags}", *extra]
    args += ["--clients", ctx.clients, "--seconds", str(ctx.seconds), "--warmup", "1", "--modes", "batched"]
    args += ["--max-batch-size", str(ctx.max_batch_size), "--json", str(out), "--log-dir", str(ctx.work)]
    result = run_child(ctx, stage, python_module(ctx, "bench.serve", *args), timeout_s)
    return json.loads(out.read_text()) if out.is_file() else {"error": result}


def memory(ctx: StageContext) -> dict[str, Any]:
    """bench.memory with real steps on this device: the levers' peak memory and step time (xlnet-large
    and -base shapes on a GPU; the preset alone on a CPU dry run)."""
    presets = "large,base" if ctx.device == "cuda" else ctx.preset
    args = ["--presets", presets, "--device", ctx.device, "--time", "--runs", str(max(2, ctx.runs // 4))]
    result = run_child(ctx, "memory", python_module(ctx, STAGE_MODULES["memory"], *args), 900)
    lines = (ctx.out / "memory.log").read_text(errors="replace").splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith("Machine:")), None)
    return (
        {"table": "\n".join(lines[start:])} if result["rc"] == 0 and start is not None else {"error": result}
    )


def graphs(ctx: StageContext) -> dict[str, Any]:
    """bench.gpu_graphs: ours (CUDA graph, torch attention, compiled), HF eager and compiled, per shape,
    with agreement against fp32 eager; the kernel's offset guard; one forward's kernels."""
    out = ctx.work / "graphs.json"
    out.unlink(missing_ok=True)
    shapes = ",".join(s for s in ctx.shapes.split(",") if s in ("1x384", "32x384")) or ctx.shapes
    args = ["--config", ctx.preset, "--shapes", shapes, "--guard", "--kernels", "--json", str(out)]
    result = run_child(ctx, "graphs", python_module(ctx, STAGE_MODULES["graphs"], *args), 600)
    return json.loads(out.read_text()) if out.is_file() else {"error": result}


# The served GPU path of issue 57: fp16 weights, one CUDA graph per batch size, every window padded to
# the model's 384 tokens (the 1x384 shape the engine alone is timed at).
SERVE_E2E_FLAGS = "--torch-device {device} --torch-dtype fp16 --pad-multiple-of 384"
# name -> (graph flag, fronts, what bench.serve measures beside the load: "all" = host stages and the
# in-process comparison, "stages" = host stages only, "load" = the load table only)
SERVE_E2E_CONFIGS = {
    "CUDA graphs, 1 front": ("--torch-cuda-graphs", 1, "all"),
    "compiled + CUDA graphs, 1 front": ("--torch-compile", 1, "stages"),
    "CUDA graphs, 8 fronts": ("--torch-cuda-graphs", 8, "load"),
}


def serve_e2e(ctx: StageContext) -> dict[str, Any]:
    """One-window questions through the server on the GPU (bench.serve: host stages, per-question end to
    end beside the engine alone, load at 1 and 16 clients; per `SERVE_E2E_CONFIGS`), and the engine
    alone per batch size as served (bench.engine_batches), in one run."""
    from train.common.sample_data import SAMPLE_DEV

    ckpt = checkpoint(ctx)
    data = ctx.work / "one-window.json"
    on_gpu = ctx.device != "cpu"  # on a CPU: a dry run of the code paths (no graphs, no fp16)
    base = (SERVE_E2E_FLAGS.format(device=ctx.device) if on_gpu else "--pad-multiple-of 384") + (
        f" --max-batch-size {ctx.max_batch_size}"
    )
    made = run_child(
        ctx,
        "serve-e2e",
        python_module(
            ctx, "bench.one_window", "--tokenizer", str(ckpt), "--data", str(SAMPLE_DEV), "--out", str(data)
        ),
        300,
    )
    if made["rc"] != 0:
        return {"error": made}
    results: dict[str, Any] = {"server flags": base, "configs": SERVE_E2E_CONFIGS}
    graphs = f"{base} --torch-cuda-graphs" if on_gpu else base
    engine_json = ctx.work / "engine-batches.json"
    engine_json.unlink(missing_ok=True)
    batches = ",".join(
        str(2**i) for i in range(ctx.max_batch_size.bit_length()) if 2**i <= ctx.max_batch_size
    )
    engine_args = [
        "--model",
        str(ckpt),
        "--backend",
        "torch",
        f"--server-args={graphs}",
        "--batches",
        batches,
    ]
    engine_args += ["--lengths", "384", "--runs", "50", "--json", str(engine_json)]
    engine = run_child(ctx, "serve-e2e", python_module(ctx, "bench.engine_batches", *engine_args), 300)
    results["engine alone"] = (
        json.loads(engine_json.read_text()) if engine_json.is_file() else {"error": engine}
    )
    for name, (graph_flag, fronts, measured) in SERVE_E2E_CONFIGS.items():
        out = ctx.work / f"serve-e2e-{name.replace(' ', '-').replace(',', '').replace('+', 'and')}.json"
        flags = f"{base} {graph_flag}" if on_gpu else base
        flags += f" --workers {fronts}" if fronts > 1 else ""
        extra = ["--data", str(data), "--questions", "60"]
        extra += {"all": [], "stages": ["--skip-bare"], "load": ["--skip-overhead"]}[measured]
        results[name] = bench_serve(ctx, "serve-e2e", ckpt, "torch", flags, out, extra, 400)
    return results


def install_wheels(ctx: StageContext) -> dict[str, Any]:
    """Join the carried parts and install their wheels into the target directory."""
    try:
        return {"installed": install(ctx.parts, ctx.target, ctx.python), "target": str(ctx.target)}
    except PartsError as exc:
        return {"error": str(exc)}


def make_target(ctx: StageContext, stage: str) -> dict[str, Any]:
    """``make gpu-test`` / ``make gpu-check`` with this Python (no index here: they fall back to it)."""
    return run_child(ctx, stage, ["make", "--no-print-directory", stage, f"PYTHON={ctx.python}"], 600)


STAGES: dict[str, Callable[[StageContext], dict[str, Any]]] = {
    "probe": probe,
    "latency-torch": lambda ctx: latency(ctx, "latency-torch", "a,c,g"),
    "serve-torch": lambda ctx: serve(ctx, "serve-torch", SERVE_TORCH),
    "memory": memory,
    "graphs": graphs,
    "serve-e2e": serve_e2e,
    "install": install_wheels,
    "latency-ort": lambda ctx: latency(ctx, "latency-ort", "h"),
    "serve-ort": lambda ctx: serve(ctx, "serve-ort", SERVE_ORT),
    "gpu-test": lambda ctx: make_target(ctx, "gpu-test"),
    "gpu-check": lambda ctx: make_target(ctx, "gpu-check"),
}


def parts_status(parts: Path) -> str:
    """One line: which carried parts are here."""
    try:
        manifest = find_manifest(parts)
        problems = part_problems(manifest)
    except PartsError as exc:
        return str(exc)
    return f"{manifest.name}: " + ("; ".join(problems) if problems else "every part here and intact")


def run_stages(ctx: StageContext, names: Sequence[str]) -> list[Path]:
    """Run ``names`` in order; each writes STAGE.json (and STAGE.log). ``report`` merges ``ctx.out``."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.work.mkdir(parents=True, exist_ok=True)
    print(f"parts: {parts_status(ctx.parts)}", flush=True)
    written = []
    for name in names:
        if name == "report":
            written += write_report([ctx.out], ctx.out)
            continue
        start = time.monotonic()
        print(f"stage {name} ...", flush=True)
        try:
            result = STAGES[name](ctx)
        except Exception as exc:  # noqa: BLE001 - one stage's failure is its result; the next stages run
            result = {"error": f"{type(exc).__name__}: {exc}"}
        record = {"stage": name, "seconds": round(time.monotonic() - start, 1), "result": result}
        path = ctx.out / f"{name}.json"
        path.write_text(json.dumps(record, indent=2, default=str))
        written.append(path)
        print(f"stage {name}: {record['seconds']} s{'; error' if 'error' in result else ''}", flush=True)
    return written


# ---- the report --------------------------------------------------------------------------------------------


def collect(dirs: Sequence[Path]) -> dict[str, Any]:
    """Every STAGE.json under ``dirs`` (a later directory's stage replaces an earlier one's)."""
    stages: dict[str, Any] = {}
    for directory in dirs:
        for path in sorted(directory.glob("*.json")):
            if path.name.startswith("summary"):
                continue
            record = json.loads(path.read_text())
            if isinstance(record, dict) and "stage" in record:
                stages[record["stage"]] = record
    return stages


def latency_rows(stages: dict[str, Any]) -> list[list[Any]]:
    """Latency rows of every latency stage, with the speed-up against (a) of the same shape recomputed."""
    rows = [
        row
        for name in ("latency-torch", "latency-ort")
        for row in (stages.get(name, {}).get("result", {}).get("rows") or [])
    ]
    reference = {r["BxT"]: r["p50 ms"] for r in rows if r["path"] == REFERENCE_PATH}
    return [
        [
            r["path"],
            r["BxT"],
            r["p50 ms"],
            r["p90 ms"],
            reference[r["BxT"]] / r["p50 ms"] if r["BxT"] in reference else "-",
        ]
        for r in rows
    ]


def serve_rows(stages: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for name in ("serve-torch", "serve-ort"):
        for config, result in (stages.get(name, {}).get("result") or {}).items():
            if "load" not in result:
                rows.append([config, "-", "-", "-", "-", "-", f"not run: {error_line(result)}"])
                continue
            for r in result["load"]:
                rows.append(
                    [
                        config,
                        r["clients"],
                        r["throughput"],
                        r["p50_ms"],
                        r["p99_ms"],
                        r["windows_per_call"],
                        r["errors"],
                    ]
                )
    return rows


def error_line(result: Any) -> str:
    """The last line a failed child printed (or the error text)."""
    error = result.get("error") if isinstance(result, dict) else result
    if isinstance(error, dict):
        return (error.get("tail") or ["(no output)"])[-1] + (" (timed out)" if error.get("timed_out") else "")
    return str(error)


def graphs_lines(stages: dict[str, Any]) -> list[str]:
    """The whole-graph paths' table, the offset guard and the kernel profile's first lines, if run."""
    result = stages.get("graphs", {}).get("result") or {}
    if "error" in result:
        return [f"- graphs: not run: {error_line(result)}", ""]
    header = ["BxT", "dtype", "path", "p50 ms", "p90 ms", "prepare s", "start max |diff|", "same best start"]
    rows = [
        [r["BxT"], r["dtype"], name]
        + (
            [
                r[name]["p50 ms"],
                r[name]["p90 ms"],
                r[name]["prepare s"],
                r[name]["start max |difference|"],
                r[name]["start same best token"],
            ]
            if "p50 ms" in r[name]
            else [r[name].get("error", "-"), "-", "-", "-", "-"]
        )
        for r in result.get("rows", [])
        for name in r
        if isinstance(r[name], dict)
    ]
    if not rows:
        return []
    lines = ["## Whole-graph torch paths (bench.gpu_graphs)", "", markdown_table(header, rows), ""]
    if guard := result.get("offset guard"):
        lines += [f"Offset guard: {guard}", ""]
    kernels = result.get("kernels")
    if kernels:
        top = ", ".join(f"{op['op']} {op['share']:.0%}" for op in kernels["top ops"][:5])
        lines += [
            f"One eager {kernels['dtype']} forward at {kernels['BxT']}: {kernels['kernels per forward']} kernels, "
            f"{kernels['summed kernel ms']:.3f} ms of kernel time (top: {top}).",
            "",
        ]
    return lines


def write_report(dirs: Sequence[Path], out: Path) -> list[Path]:
    """``summary.json`` (every stage) and ``summary.md`` (the tables) in ``out``."""
    stages = collect(dirs)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# GPU run", ""]
    facts = (stages.get("probe", {}).get("result") or {}).get("facts") or {}
    if facts:
        lines += [f"Machine: {facts.get('summary', '?')}", ""]
    lat = latency_rows(stages)
    if lat:
        header = ["path", "BxT", "p50 ms", "p90 ms", "speed-up vs (a) HF eager fp32"]
        lines += ["## Latency (bench.latency, random weights)", "", markdown_table(header, lat), ""]
    for name in ("latency-torch", "latency-ort"):
        for path, why in ((stages.get(name, {}).get("result") or {}).get("skipped") or {}).items():
            lines.append(f"- {path}: skipped: {why}")
    srv = serve_rows(stages)
    if srv:
        header = ["server", "clients", "req/s", "p50 ms", "p99 ms", "windows/call", "errors"]
        lines += [
            "",
            "## Server (bench.serve, batched, closed-loop clients)",
            "",
            markdown_table(header, srv),
            "",
        ]
    lines += graphs_lines(stages)
    table = (stages.get("memory", {}).get("result") or {}).get("table")
    if table:
        lines += ["## Training memory and step time per lever (bench.memory)", "", table, ""]
    for name in ("install", "gpu-test", "gpu-check"):
        if name in stages:
            result = stages[name]["result"]
            status = "error: " + error_line(result) if "error" in result else f"exit {result.get('rc', 0)}"
            lines.append(f"- {name}: {status}; last line: {(result.get('tail') or [''])[-1]}")
    (out / "summary.json").write_text(json.dumps(stages, indent=2, default=str))
    (out / "summary.md").write_text("\n".join(lines).rstrip() + "\n")
    return [out / "summary.json", out / "summary.md"]
