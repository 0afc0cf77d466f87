"""``python -m bench.op_profile``: where an ONNX export's time goes, by operator type, on the CPU.

onnxruntime's own profiler (``enable_profiling``) records each node's kernel time; this tool runs our
export with the server's session settings (``qa_core.runtime.sessions.session``, explicit threads),
keeps the node times of the measured runs (warm-up runs are left out, by the ``model_run`` events that
bound each run), and adds them up per operator type and per group: the int8 compute
(``MatMulInteger`` / ``DynamicQuantizeLinear`` and the fused forms onnxruntime makes of them), float
GEMMs, the shape plumbing (``Gather`` / ``Slice`` / ``Concat`` / ``Unsqueeze`` / ``Reshape`` ...: the
relative attention's index work), and the element-wise rest; with the slowest nodes by name.

    python -m bench.op_profile                      # a random xlnet-base int8 export at 1x384, 2 threads
    python -m bench.op_profile --model runs/export-int8 --shape 1x384 --runs 20 [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import cpu_summary, markdown_table

INT8 = {
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QLinearMatMul",
    "QuantizeLinear",
    "DequantizeLinear",
}
FLOAT_GEMM = {"MatMul", "Gemm", "FusedGemm", "FusedMatMul"}
PLUMBING = {
    "Gather", "GatherElements", "GatherND", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Transpose",
    "Shape", "Expand", "Cast", "Identity", "Flatten", "Split", "Range", "ConstantOfShape", "Where", "Pad",
    "Tile", "ScatterND", "Equal", "Not", "And", "Less", "Greater", "Size",
}  # fmt: skip
GROUPS = ("int8 compute", "float GEMM", "shape plumbing", "element-wise and normalisation")


def group_of(op: str) -> str:
    if op in INT8:
        return GROUPS[0]
    if op in FLOAT_GEMM:
        return GROUPS[1]
    return GROUPS[2] if op in PLUMBING else GROUPS[3]


def measured_nodes(events: Sequence[dict[str, Any]], runs: int) -> tuple[list[dict[str, Any]], float]:
    """The node-kernel events inside the last ``runs`` ``model_run`` events, and those runs' mean wall
    time in ms."""
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-runs:]
    if not model_runs:
        raise ValueError("the profile holds no model_run event")
    spans = [(r["ts"], r["ts"] + r["dur"]) for r in model_runs]
    nodes = [
        e
        for e in events
        if e.get("cat") == "Node"
        and str(e.get("name", "")).endswith("_kernel_time")
        and any(start <= e["ts"] <= end for start, end in spans)
    ]
    return nodes, sum(r["dur"] for r in model_runs) / len(model_runs) / 1000.0


def aggregate(nodes: Sequence[dict[str, Any]], runs: int, top: int) -> dict[str, Any]:
    """Per operator type and per group: ms per run, nodes per run, share of the node time."""
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    by_node: dict[tuple[str, str], float] = defaultdict(float)
    for e in nodes:
        op = e.get("args", {}).get("op_name", "?")
        by_op[op][0] += e["dur"] / 1000.0 / runs
        by_op[op][1] += 1 / runs
        by_node[(e["name"].removesuffix("_kernel_time"), op)] += e["dur"] / 1000.0 / runs
    total = sum(ms for ms, _ in by_op.values()) or 1.0
    ops: list[dict[str, Any]] = sorted(
        (
            {"op": op, "group": group_of(op), "ms": ms, "nodes": count, "share": ms / total}
            for op, (ms, count) in by_op.items()
        ),
        key=lambda r: -r["ms"],
    )
    groups = {g: sum(r["ms"] for r in ops if r["group"] == g) for g in GROUPS}
    slowest = sorted(by_node.items(), key=lambda kv: -kv[1])[:top]
    return {
        "node_ms_per_run": total,
        "ops": ops,
        "groups": {g: {"ms": ms, "share": ms / total} for g, ms in groups.items()},
        "slowest_nodes": [{"node": name, "op": op, "ms": ms} for (name, op), ms in slowest],
    }


def random_export(work: Path, preset: str, precision: str) -> Path:
    """A random QA model of ``preset``'s shape exported by our exporter at ``precision``."""
    from export.onnx.exporter import OnnxExportOptions, export_onnx
    from harness.tiny_models import tiny_qa_checkpoint
    from train.common.cli import to_stderr
    from train.common.sample_data import SAMPLE_CORPUS
    from train.model.config import PRESETS
    from train.tokenizer import train_spm

    train_spm([SAMPLE_CORPUS], work / "tokenizer", 2000)
    shape = {k: v for k, v in PRESETS[preset].items() if k != "vocab_size"}
    ckpt = tiny_qa_checkpoint(work / "checkpoint", work / "tokenizer", "shallow", **{**shape, "dropout": 0.0})
    options = OnnxExportOptions(checkpoint=ckpt, out=work / f"onnx-{precision}", precision=precision)
    return export_onnx(options, report=lambda line: print(line, file=sys.stderr), warn=to_stderr).out


def profile(
    export_dir: Path, batch: int, length: int, threads: int, runs: int, warmup: int, work: Path
) -> dict[str, Any]:
    """Profile ``runs`` runs (after ``warmup``) of the export's served graph on a ``batch`` x ``length`` window."""
    from qa_core.runtime.sessions import session
    from qa_core.runtime.sidecar import Sidecar
    from server.backends.base import dummy_batch

    side = Sidecar.load(export_dir)
    sess = session(
        export_dir / side.model_file, threads=threads, level="all", profile_prefix=work / "ort-profile"
    )
    wanted = {i.name for i in sess.get_inputs()}
    feeds = {k: v for k, v in dummy_batch(batch, length).items() if k in wanted}
    for _ in range(warmup + runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    nodes, wall_ms = measured_nodes(events, runs)
    result = aggregate(nodes, runs, top=12)
    return {
        "model": str(export_dir),
        "precision": side.precision,
        "shape": f"{batch}x{length}",
        "threads": threads,
        "wall_ms_per_run": wall_ms,
        **result,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['model']} ({result['precision']}) at {result['shape']}, {result['threads']} thread(s): "
        f"{result['wall_ms_per_run']:.2f} ms per run, {result['node_ms_per_run']:.2f} ms in nodes",
        "",
        markdown_table(
            ["group", "ms per run", "share"],
            [[g, v["ms"], f"{100 * v['share']:.1f}%"] for g, v in result["groups"].items()],
        ),
        "",
        markdown_table(
            ["op type", "group", "nodes per run", "ms per run", "share"],
            [
                [r["op"], r["group"], round(r["nodes"]), r["ms"], f"{100 * r['share']:.1f}%"]
                for r in result["ops"]
            ],
        ),
        "",
        markdown_table(
            ["slowest node", "op", "ms per run"],
            [[n["node"], n["op"], n["ms"]] for n in result["slowest_nodes"]],
        ),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.op_profile", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--model", type=Path, help="an export directory (default: a random --preset export)")
    p.add_argument("--preset", default="base", help="the random model's shape when no --model")
    p.add_argument(
        "--precision", default="int8", choices=["fp32", "fp16", "int8"], help="the random export's"
    )
    p.add_argument("--shape", default="1x384", help="BxT of the window batch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    try:
        batch, length = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        p.error(f"--shape must be BxT, got {args.shape!r}")
    if args.model is not None and not (args.model / "export.json").is_file():
        p.error(f"--model {args.model}: not an export directory (no export.json)")
    if min(batch, length, args.threads, args.runs) < 1 or args.warmup < 0:
        p.error("--shape, --threads and --runs must be positive, --warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="op-profile-") as tmp:
        model = args.model or random_export(Path(tmp), args.preset, args.precision)
        result = profile(model, batch, length, args.threads, args.runs, args.warmup, Path(tmp))
    print(f"Machine: {cpu_summary()}\n")
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
