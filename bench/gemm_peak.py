"""``python -m bench.gemm_peak``: what this CPU's matrix products reach, so every CPU path of the model
can be stated as a fraction of this machine's peak rather than of a datasheet's.

One operator per ONNX graph (the constant operand an initializer, as a model's weights are), through
onnxruntime with the server's session settings and explicit threads: fp32 ``MatMul`` (GFLOP/s) and
int8 ``MatMulInteger`` with uint8 activations and int8 weights, what our int8 export's
DynamicQuantizeLinear + MatMulInteger run (GOP/s, 2 per multiply-add as for floats); and torch's fp32
``matmul`` with the same threads. Square sizes up to 2048 and the GEMMs of an xlnet-base layer at 384
tokens ([384, 768] x [768, 768] for q/k/v/o, x [768, 3072] and [3072, 768] for the feed-forward).

    python -m bench.gemm_peak [--threads 2] [--shapes 2048x2048x2048,...] [--runs 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from bench.common import cpu_summary, markdown_table, pct, time_runs

SHAPES = "2048x2048x2048,1024x1024x1024,512x512x512,384x768x768,384x768x3072,384x3072x768"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``MxKxN,...`` -> [(M, K, N), ...]: A is [M, K], B [K, N]."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"a shape is MxKxN with positive sizes, got {item.strip()!r}")
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return shapes


def matmul_graph(m: int, k: int, n: int, integer: bool, rng: np.random.Generator) -> bytes:
    """A one-node ONNX model: A [m, k] (input) times the initializer B [k, n]."""
    from onnx import TensorProto, helper, numpy_helper

    if integer:
        b = rng.integers(-127, 128, (k, n), dtype=np.int8)
        inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.array(128, np.uint8), "a_zero")]
        inits.append(numpy_helper.from_array(np.array(0, np.int8), "b_zero"))
        node = helper.make_node("MatMulInteger", ["A", "B", "a_zero", "b_zero"], ["Y"])
        a_type, y_type = TensorProto.UINT8, TensorProto.INT32
    else:
        inits = [numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "B")]
        node = helper.make_node("MatMul", ["A", "B"], ["Y"])
        a_type = y_type = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "gemm",
        [helper.make_tensor_value_info("A", a_type, [m, k])],
        [helper.make_tensor_value_info("Y", y_type, [m, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def ort_runner(m: int, k: int, n: int, integer: bool, threads: int, tmp: Path) -> Callable[[], object]:
    from qa_core.runtime.sessions import session

    rng = np.random.default_rng(0)
    path = tmp / f"{'int8' if integer else 'fp32'}-{m}x{k}x{n}.onnx"
    path.write_bytes(matmul_graph(m, k, n, integer, rng))
    sess = session(path, threads=threads, level="all")
    a = (
        rng.integers(0, 256, (m, k), dtype=np.uint8)
        if integer
        else rng.standard_normal((m, k), dtype=np.float32)
    )
    return lambda: sess.run(None, {"A": a})


def torch_runner(m: int, k: int, n: int, threads: int) -> Callable[[], object]:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)

    def run() -> object:
        with torch.inference_mode():
            return a @ b

    return run


PATHS = ("onnxruntime MatMul fp32", "onnxruntime MatMulInteger u8s8", "torch matmul fp32")


def runner_for(path: str, shape: tuple[int, int, int], threads: int, tmp: Path) -> Callable[[], object]:
    m, k, n = shape
    if path == PATHS[2]:
        return torch_runner(m, k, n, threads)
    return ort_runner(m, k, n, path == PATHS[1], threads, tmp)


def measure(shapes: Sequence[tuple[int, int, int]], threads: int, runs: int, warmup: int) -> list[dict]:
    """One row per (path, shape): p50 ms and G(FL)OP/s."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gemm-peak-") as tmp:
        for shape in shapes:
            m, k, n = shape
            for name in PATHS:
                times = time_runs(runner_for(name, shape, threads, Path(tmp)), warmup=warmup, runs=runs)
                p50 = pct(times, 50)
                rows.append(
                    {
                        "path": name,
                        "MxKxN": f"{m}x{k}x{n}",
                        "p50_ms": p50 * 1e3,
                        "G_per_s": 2 * m * k * n / p50 / 1e9,
                    }
                )
                print(f"  {name} {m}x{k}x{n}: {rows[-1]['G_per_s']:.1f} G/s", file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gemm_peak", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shapes", default=SHAPES, help="MxKxN list: A [M, K] times B [K, N]")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        p.error(f"--shapes: {exc}")
    if args.threads < 1 or args.runs < 1 or args.warmup < 0:
        p.error("--threads and --runs must be >= 1, --warmup >= 0")
    rows = measure(shapes, args.threads, args.runs, args.warmup)
    machine = f"{cpu_summary()}, {args.threads} thread(s)"
    print(f"Machine: {machine}\n")
    table = [[r["path"], r["MxKxN"], r["p50_ms"], r["G_per_s"]] for r in rows]
    print(markdown_table(["path", "MxKxN", "p50 ms", "GFLOP/s (int8: GOP/s)"], table))
    best: dict[str, float] = {}
    for r in rows:
        best[r["path"]] = max(best.get(r["path"], 0.0), r["G_per_s"])
    print("\nPeak measured (the best shape): " + "; ".join(f"{k} {v:.1f}" for k, v in best.items()))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows, "peak": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
