"""``python -m bench.cpu_bound``: the fastest our int8 xlnet-base could run on this CPU, beside HF eager.

A floor, not a forecast: the matrix products our int8 export runs (counted from onnxruntime's own
profile of one run: the int8 ones, the weights' projections, and the float ones, mostly the attention
products between activations) divided by the best rate this CPU's onnxruntime reaches at the model's
own shapes, with everything else (softmax, GELU, LayerNorm, the relative shift, quantizing activations)
taken as free. Two floors: the float products at the attention's fp32 rate (what onnxruntime runs them
in), and every product at the int8 rate (what a fused int8 attention kernel could reach at best). Measured in one run with HF eager and our int8 export at the same shape, so
"at most N x HF eager" is a statement about this machine, which the docs' targets can be held to.

    python -m bench.cpu_bound [--threads 2] [--shape 1x384] [--runs 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REFERENCE_PATH, machine_line, markdown_table, pct, time_runs

INT8_PRODUCTS = {"DynamicQuantizeMatMul", "MatMulInteger", "MatMulIntegerToFloat"}
FLOAT_PRODUCTS = {"MatMul", "FusedMatMul", "Gemm", "FusedGemm"}
# products this count cannot size from a node's shapes: a graph holding one is refused, not floored low
UNSIZED_PRODUCTS = {
    "Einsum", "Attention", "MultiHeadAttention", "QAttention", "QLinearMatMul", "MatMulNBits",
    "Conv", "ConvInteger", "QOrderedMatMul", "GroupQueryAttention",
}  # fmt: skip


def node_attributes(model_path: Path) -> dict[str, dict[str, int]]:
    """Each node's integer attributes (transA, transB, transBatchA ...) by name, from the graph
    onnxruntime optimised (its fused nodes are not in the exported file)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return {
        n.name: {a.name: int(a.i) for a in n.attribute if a.type == onnx.AttributeProto.INT}
        for n in model.graph.node
    }


def product_ops(event: dict[str, Any], attributes: dict[str, int] | None = None) -> float:
    """Operations (2 per multiply-add) of one matrix-product node as onnxruntime ran it: 2 |C| K, with
    C's size from the profile's output shape (broadcast batches included) and K, the contracted length,
    A's last axis (its second last when the node transposes A). A is the first input, which the profile
    always lists (it omits constant weights, and a bias does not count)."""
    attributes = attributes or {}
    if attributes.get("transBatchA") or attributes.get("transBatchB"):
        raise ValueError(f"{event.get('name')}: a batch-transposed product, which this count does not size")
    args = event["args"]
    a_dims = next(iter(args["input_type_shape"][0].values()))
    c_dims = next(iter(args["output_type_shape"][0].values()))
    k = a_dims[-2] if attributes.get("transA") and len(a_dims) >= 2 else a_dims[-1]
    return 2.0 * math.prod(c_dims) * k


def counted_products(
    nodes: Sequence[dict[str, Any]], runs: int, attributes: dict[str, dict[str, int]] | None = None
) -> tuple[float, float]:
    """(int8 ops, float ops) per run of the profiled graph's matrix products; other nodes are left out
    (the floor takes them as free). A product this count cannot size is a ValueError."""
    attributes = attributes or {}
    int8 = floats = 0.0
    for e in nodes:
        op = e["args"].get("op_name", "")
        name = str(e.get("name", "")).removesuffix("_kernel_time")
        if op in UNSIZED_PRODUCTS:
            raise ValueError(f"{name}: {op} is a product this floor cannot size; it would count it as free")
        if op in INT8_PRODUCTS:
            int8 += product_ops(e, attributes.get(name))
        elif op in FLOAT_PRODUCTS:
            floats += product_ops(e, attributes.get(name))
    return int8 / runs, floats / runs


def floor_ms(int8_ops: float, float_ops: float, int8_rate: float, float_rate: float) -> float:
    """Milliseconds for the products alone at the given rates (operations per second)."""
    return (int8_ops / int8_rate + float_ops / float_rate) * 1e3


def attention_graph(heads: int, m: int, k: int, n: int) -> bytes:
    """A one-node ONNX model: [heads, m, k] x [heads, k, n], both inputs (activations, as in attention)."""
    from onnx import TensorProto, helper

    node = helper.make_node("MatMul", ["A", "B"], ["Y"])
    graph = helper.make_graph(
        [node],
        "attention-product",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, [heads, m, k]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [heads, k, n]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [heads, m, n])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def attention_rate(heads: int, t: int, d_head: int, threads: int, runs: int, tmp: Path) -> dict[str, Any]:
    """The best fp32 rate of onnxruntime's batched MatMul at the attention's shapes: scores [T, d] x [d, T]
    and values [T, T] x [T, d], per head."""
    from qa_core.runtime.sessions import session

    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for m, k, n in ((t, d_head, t), (t, t, d_head)):
        path = tmp / f"attention-{heads}x{m}x{k}x{n}.onnx"
        path.write_bytes(attention_graph(heads, m, k, n))
        sess = session(path, threads=threads, level="all")
        feeds = {
            "A": rng.standard_normal((heads, m, k), dtype=np.float32),
            "B": rng.standard_normal((heads, k, n), dtype=np.float32),
        }

        def run(sess: Any = sess, feeds: dict[str, np.ndarray] = feeds) -> object:
            return sess.run(None, feeds)

        best = float(np.min(time_runs(run, warmup=3, runs=runs)))  # a floor takes the fastest call seen
        rate = 2 * heads * m * k * n / best / 1e9
        rows.append({"shape": f"{heads}x{m}x{k}x{n}", "best_ms": best * 1e3, "G_per_s": rate})
    return {"rows": rows, "best": max(float(r["G_per_s"]) for r in rows)}


def int8_gemm_rates(
    shapes: Sequence[tuple[int, int, int]], threads: int, runs: int, tmp: Path
) -> list[dict[str, Any]]:
    """onnxruntime's MatMulInteger (u8 x s8, the int8 export's product) at each shape, from its fastest
    call (bench.gemm_peak's runner; that tool reports medians)."""
    from bench.gemm_peak import ort_runner

    rows = []
    for m, k, n in shapes:
        best = float(np.min(time_runs(ort_runner(m, k, n, True, threads, tmp), warmup=3, runs=runs)))
        rows.append({"MxKxN": f"{m}x{k}x{n}", "best_ms": best * 1e3, "G_per_s": 2 * m * k * n / best / 1e9})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_bound", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="base", help="model shape (random weights): base, small, tiny ...")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shape", default="1x384", help="BxT")
    p.add_argument("--runs", type=int, default=8, help="timed calls of each model (each GEMM: 4x as many)")
    p.add_argument("--target", type=float, default=5.0, help="the multiple of HF eager to hold the floor to")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    try:
        b, t = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        p.error(f"--shape is BxT, got {args.shape!r}")
    if min(b, t, args.threads, args.runs, args.vocab) < 1 or args.target <= 0:
        p.error("--shape sizes, --threads, --runs and --vocab must be >= 1, --target > 0")

    import torch
    import transformers

    from bench.latency import HFWrapper, export_ours, make_inputs
    from bench.op_profile import measured_nodes
    from qa_core.contract import INPUT_NAMES
    from qa_core.runtime.sessions import session
    from qa_core.tokenizer import XLNetTokenizer
    from train.common.sample_data import SAMPLE_CORPUS
    from train.model import XLNetConfig, XLNetForQuestionAnswering, checkpoint
    from train.tokenizer import train_spm

    torch.set_num_threads(args.threads)
    from train.model.config import PRESETS

    if args.preset not in PRESETS:
        p.error(f"--preset: one of {', '.join(sorted(PRESETS))}")
    config = XLNetConfig.preset(args.preset, vocab_size=args.vocab, dropout=0.0)
    torch.manual_seed(0)
    ours = XLNetForQuestionAnswering(config, head="simple").eval()
    feeds = make_inputs(b, t, config.vocab_size)
    tensors = tuple(torch.from_numpy(feeds[n]) for n in INPUT_NAMES)

    with tempfile.TemporaryDirectory(prefix="cpu-bound-") as tmp_name:
        tmp = Path(tmp_name)
        train_spm([SAMPLE_CORPUS], tmp / "tok", 2000)
        checkpoint.save(ours, tmp / "ckpt", tokenizer=XLNetTokenizer.from_dir(tmp / "tok"))
        hf = transformers.XLNetForQuestionAnsweringSimple.from_pretrained(tmp / "ckpt").eval()
        int8_path = export_ours(tmp / "ckpt", tmp / "onnx-int8", "int8")
        if int8_path is None:
            print("our int8 export does not verify; no floor to compare with", file=sys.stderr)
            return 1
        # what the graph computes, as onnxruntime runs it: one profiled run after a warm-up
        optimized = tmp / "optimized.onnx"
        profiled = session(
            int8_path,
            threads=args.threads,
            level="all",
            profile_prefix=tmp / "profile",
            optimized_path=optimized,
        )
        for _ in range(2):
            profiled.run(None, feeds)
        nodes, _ = measured_nodes(json.loads(Path(profiled.end_profiling()).read_text()), 1)
        int8_ops, float_ops = counted_products(nodes, 1, node_attributes(optimized))
        print(
            f"products per forward at {b}x{t}: int8 {int8_ops / 1e9:.2f} GOP, float {float_ops / 1e9:.2f} GFLOP",
            file=sys.stderr,
        )
        d, ff, rows_t = config.d_model, config.d_inner, b * t
        gemm_shapes = [(rows_t, d, d), (rows_t, d, ff), (rows_t, ff, d)]
        gemms = int8_gemm_rates(gemm_shapes, args.threads, args.runs * 4, tmp)
        int8_rate = max(r["G_per_s"] for r in gemms) * 1e9
        attention = attention_rate(config.n_head * b, t, config.d_head, args.threads, args.runs * 4, tmp)
        fp32_attention_rate = attention["best"] * 1e9

        sess = session(int8_path, threads=args.threads, level="all")  # the server's settings
        wrapped = HFWrapper(hf)

        def hf_eager() -> object:
            with torch.inference_mode():
                return wrapped(*tensors)

        timed: dict[str, Callable[[], object]] = {
            REFERENCE_PATH: hf_eager,
            "(e) ours ONNX int8": lambda: sess.run(None, feeds),
        }
        measured = {
            name: pct(time_runs(fn, warmup=2, runs=args.runs), 50) * 1e3 for name, fn in timed.items()
        }

    hf_ms = measured[REFERENCE_PATH]
    floors = {
        "products only, float ones at the attention's fp32 rate": floor_ms(
            int8_ops, float_ops, int8_rate, fp32_attention_rate
        ),
        "products only, all at the int8 rate": floor_ms(int8_ops, float_ops, int8_rate, int8_rate),
    }
    ops = int8_ops + float_ops

    def peak_share(ms: float) -> str:
        """The graph's products per second as a share of the int8 GEMM rate (HF's own count differs)."""
        return f"{ops / (ms / 1e3) / int8_rate:.0%}"

    table = [
        [name, ms, hf_ms / ms, "" if name == REFERENCE_PATH else peak_share(ms)]
        for name, ms in measured.items()
    ]
    table += [[f"floor: {name}", ms, hf_ms / ms, peak_share(ms)] for name, ms in floors.items()]
    machine = machine_line(args.threads)
    print(
        f"Machine: {machine}\nShape {b}x{t}; int8 GEMM rate {int8_rate / 1e9:.0f} GOP/s (best of the model's shapes), "
        f"fp32 attention products {fp32_attention_rate / 1e9:.0f} GFLOP/s\n"
    )
    print(
        markdown_table(["path", "p50 ms", "x HF eager", "products / s, share of the int8 GEMM rate"], table)
    )
    budget = hf_ms / args.target
    print(
        f"\n{args.target:g}x HF eager needs <= {budget:.1f} ms: the products alone take "
        + ", ".join(f"{ms:.1f} ms ({name})" for name, ms in floors.items())
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine,
                    "preset": args.preset,
                    "shape": f"{b}x{t}",
                    "threads": args.threads,
                    "int8_product_ops": int8_ops,
                    "float_product_flops": float_ops,
                    "gemms": gemms,
                    "attention_products": attention["rows"],
                    "p50_ms": measured,
                    "floor_ms": floors,
                    "int8_gemm_rate": int8_rate,
                    "target_multiple": args.target,
                    "target_ms": budget,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
