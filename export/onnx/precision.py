"""Reduced-precision graphs: float16 (for GPUs / strongly typed TensorRT) and dynamic int8 (for CPUs).

- fp16: onnxruntime's copy of onnxconverter-common's `convert_float_to_float16` (no extra dependency),
  `keep_io_types=True` so callers still feed int64 and read float32. An export of `QAInference` carries
  its relative-position tables as constants, computed (sinusoids and projection) in float32 at export
  time and stored in float16 here; a graph that computes the sinusoids itself keeps those nodes, and the
  values passed between them, float32 (:func:`export.onnx.graph.fp32_island`), as the PyTorch model builds
  the table before `.to(dtype)`. TopK stays float32 (the converter's default block list). Constants beyond fp16 range (the -1e30 mask
  values) are clipped to -65504, which the model's own fp16 path uses too.
- int8: `quantize_dynamic` with signed int8 weights on every backbone MatMul whose weight is a constant
  (each layer's one input projection, which carries q, k, v and the segment term, its output projection and
  the feed-forward layers; r is a precomputed table); activation x activation MatMuls
  (attention scores) stay float, and activations are quantized per call (no calibration data). The QA
  heads' MatMuls stay float unless asked (`heads=True`): they map the hidden state straight to logits, so
  the per-tensor activation rounding lands on the logits unattenuated. Measured on a d_model 256 model:
  quantizing them raised max |d end_logits| from 0.17 to 5.0 (logits of scale 30), while they cost <1%
  of the FLOPs (d x 1 projections; the deep head's MLPs a few %). Per-channel weight scales did not help.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import onnx

from export.onnx.graph import constant_weight_matmuls, fp32_island, matmul_weights


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float16 copy of a float32 graph with float32 inputs/outputs (sinusoid nodes, if any, float32)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    island = fp32_island(model)
    converted = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=list(DEFAULT_OP_BLOCK_LIST),
        node_block_list=island,
    )
    _drop_duplicate_nodes(converted)
    _drop_fp16_round_trips(converted, set(island))
    return converted


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _drop_fp16_round_trips(model: onnx.ModelProto, island: set[str]) -> None:
    """The converter passes every value between two float32 nodes through float16 (a Cast to fp16, then
    one back to fp32): the sinusoids' angles (positions up to 512) would lose their fractional part.
    A float32 consumer reads the float32 value itself when it comes from the island or a float32 graph
    input; the Casts of such round trips go (the one to fp16 stays while fp16 nodes read it)."""
    float32, float16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    producer = {out: node for node in model.graph.node for out in node.output}
    sources = {i.name for i in model.graph.input if i.type.tensor_type.elem_type == float32}
    sources |= {out for node in model.graph.node if node.name in island for out in node.output}
    graph_outputs = {o.name for o in model.graph.output}
    same: dict[str, str] = {}  # a Cast-to-fp32's output -> the fp32 value before the round trip
    halves: set[str] = set()  # the round trips' Cast-to-fp16 outputs
    for node in model.graph.node:
        first = producer.get(node.input[0]) if node.op_type == "Cast" else None
        if (
            first is not None
            and _cast_to(node) == float32
            and _cast_to(first) == float16
            and first.input[0] in sources
            and node.output[0] not in graph_outputs
        ):
            same[node.output[0]] = first.input[0]
            halves.add(first.output[0])
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = same.get(name, name)
    kept = [n for n in model.graph.node if n.output[0] not in same]
    used = {name for node in kept for name in node.input} | graph_outputs
    kept = [n for n in kept if n.output[0] not in halves or n.output[0] in used]
    del model.graph.node[:]
    model.graph.node.extend(kept)


def _drop_duplicate_nodes(model: onnx.ModelProto) -> None:
    """The converter inserts one identical Cast per consumer of a value (Sin and Cos share their input);
    identical copies (same op, inputs, outputs and attributes) are one node."""
    seen: set[bytes] = set()
    kept = []
    for node in model.graph.node:
        key = node.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)


def quantize_int8(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    per_channel: bool = False,
    heads: bool = False,
    activations: bool = False,
) -> dict[str, Any]:
    """Dynamic int8 quantization of `src` into `dst`; returns counts of what was quantized.

    Every backbone MatMul with a constant weight is quantized; the QA heads' own MatMuls only with
    `heads` (see the module doc). Per-channel scales exist only for 2-D weights in onnxruntime's
    MatMulInteger kernels, so with `per_channel` a batched (3-D) weight stays float (the fused layers have
    none; a graph that has one, e.g. a reference layer's segment term, keeps it float). With `activations`
    the backbone's products of two activations (the attention's scores and value products) are quantized
    too, both operands per call (onnxruntime's MatMulConstBOnly off).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    excluded = (batched_weight_matmuls(model) if per_channel else []) + ([] if heads else head_matmuls(model))
    if activations and not heads:  # the heads' products of two activations stay float too
        excluded += [
            n.name for n in model.graph.node if n.op_type == "MatMul" and "/transformer/" not in n.name
        ]
        excluded = list(dict.fromkeys(excluded))
    with _quiet_root_logger():  # "consider pre-processing": the input is already constant-folded
        quantize_dynamic(
            str(src),
            str(dst),
            op_types_to_quantize=["MatMul", "Gemm"],
            per_channel=per_channel,
            weight_type=QuantType.QInt8,
            # quantize_dynamic first rewrites a Gemm as "<name>_MatMul" + Add: exclude it by both names
            nodes_to_exclude=excluded + [f"{name}_MatMul" for name in excluded],
            # Tensors produced by contrib ops have no inferred type; they are float here.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT, "MatMulConstBOnly": not activations},
        )
    total, const = matmul_weights(model)
    quantized = sum(
        n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in onnx.load(str(dst)).graph.node
    )
    return {
        "method": "onnxruntime quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": per_channel,
        "matmuls": total,
        "matmuls_with_constant_weight": const,
        "quantized": quantized,
        "heads_quantized": heads,
        "activation_products_quantized": activations,
        "excluded": excluded,
    }


def head_matmuls(model: onnx.ModelProto) -> list[str]:
    """MatMul/Gemm nodes of the QA heads (everything outside the backbone, `/model/transformer/`)."""
    return [name for name in constant_weight_matmuls(model) if "/transformer/" not in name]


def batched_weight_matmuls(model: onnx.ModelProto) -> list[str]:
    """MatMul nodes whose constant weight has more than 2 dimensions."""
    ranks = {init.name: len(init.dims) for init in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and ranks.get(n.input[1], 2) > 2]


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
