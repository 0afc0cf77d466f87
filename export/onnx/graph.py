"""ONNX graph passes and checks for the exported QA model (torch-free: onnx + onnxruntime tools only).

- :func:`fold_static_ifs`: the TorchScript exporter turns ``x.squeeze(d)`` on a dynamically shaped tensor
  into ``If(shape[d] == 1, Squeeze, Identity)``; symbolic shape inference proves the dimension is 1, and the
  ``If`` becomes a plain ``Squeeze`` (control flow blocks fusions and TensorRT handles it poorly).
- :func:`check_graph`: no EyeLike/OneHot/Einsum (TensorRT rejects or slows on them), no control flow, and
  no constant that feeds a shape input with a value derived from the trace length (shape specialisation).
- :func:`fp32_island`: the sinusoid position-table nodes, which must stay float32 in a float16 graph
  (angles up to 2 * seq_len lose whole radians in fp16), as the PyTorch model computes them.
"""

from __future__ import annotations

import collections
import copy
import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

logger = logging.getLogger(__name__)

FORBIDDEN_OPS = ("EyeLike", "OneHot", "Einsum", "If", "Loop", "Scan")
# (op_type, input index) pairs whose value is a shape, size, or position bound.
SHAPE_INPUTS = {
    ("Reshape", 1),
    ("Expand", 1),
    ("ConstantOfShape", 0),
    ("Tile", 1),
    ("Slice", 1),
    ("Slice", 2),
    ("Range", 0),
    ("Range", 1),
}


class GraphCheckError(ValueError):
    """The exported graph holds something a portable, dynamically shaped model must not."""


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type (contrib ops prefixed with their domain, e.g. ``com.microsoft.BiasGelu``)."""
    counts = collections.Counter(
        (f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type)
        for n in model.graph.node
    )
    return dict(sorted(counts.items()))


def nonstandard_ops(model: onnx.ModelProto) -> list[str]:
    """Op types outside the default ONNX domain (onnxruntime contrib ops that TensorRT cannot parse)."""
    return sorted({f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain not in ("", "ai.onnx")})


def _constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def constant_weight_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of MatMul/Gemm nodes whose second operand is a constant weight (what int8 can quantize)."""
    consts = _constant_values(model)
    return [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in consts]


def matmul_weights(model: onnx.ModelProto) -> tuple[int, int]:
    """(MatMul + Gemm nodes, those with a constant weight)."""
    total = sum(n.op_type in ("MatMul", "Gemm") for n in model.graph.node)
    return total, len(constant_weight_matmuls(model))


# --- If folding ----------------------------------------------------------------------------------------
def _branch_op(graph: onnx.GraphProto) -> tuple[str, str, list[int] | None] | None:
    """A branch that is just ``Squeeze(x, axes)`` (axes from a Constant) or ``Identity(x)``."""
    nodes = [n for n in graph.node if n.op_type != "Constant"]
    consts = {
        n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"
    }
    if len(nodes) != 1 or len(graph.output) != 1 or nodes[0].output[0] != graph.output[0].name:
        return None
    node = nodes[0]
    if node.op_type == "Identity":
        return "Identity", node.input[0], None
    if node.op_type == "Squeeze":
        if len(node.input) > 1 and node.input[1] in consts:
            return "Squeeze", node.input[0], [int(a) for a in np.atleast_1d(consts[node.input[1]])]
        for attr in node.attribute:
            if attr.name == "axes":
                return "Squeeze", node.input[0], list(attr.ints)
    return None


def _static_dims(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Value name -> dims (int where known) from onnxruntime's symbolic shape inference."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    # It logs a warning for every comparison of symbolic lengths it cannot decide ("Cannot determine if
    # 512 - sequence < 0"): expected with dynamic axes, and dozens of lines on the exporting user's terminal.
    infer_log = logging.getLogger(SymbolicShapeInference.__module__)
    level = infer_log.level
    infer_log.setLevel(logging.ERROR)
    try:
        inferred = SymbolicShapeInference.infer_shapes(copy.deepcopy(model), auto_merge=True)
    finally:
        infer_log.setLevel(level)
    dims: dict[str, list[int | None]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return dims


def fold_static_ifs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Replace squeeze-or-not ``If`` nodes whose answer is fixed by static shapes; returns (model, n folded)."""
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    if not ifs:
        return model, 0
    try:
        dims = _static_dims(model)
    except Exception as exc:  # noqa: BLE001 - inference is best effort; the graph check reports what is left
        logger.warning("symbolic shape inference failed (%s); If nodes are left as they are", exc)
        return model, 0
    new_nodes: list[onnx.NodeProto] = []
    folded = 0
    for node in model.graph.node:
        replacement = _fold_one(model, node, dims) if node.op_type == "If" else None
        if replacement is None:
            new_nodes.append(node)
        else:
            new_nodes.extend(replacement)
            folded += 1
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    remove_dead_nodes(model)
    return model, folded


def _fold_one(model: onnx.ModelProto, node: onnx.NodeProto, dims) -> list[onnx.NodeProto] | None:
    branches = {a.name: _branch_op(a.g) for a in node.attribute if a.name in ("then_branch", "else_branch")}
    kinds = {b[0] for b in branches.values() if b}
    if kinds != {"Squeeze", "Identity"} or len({b[1] for b in branches.values() if b is not None}) != 1:
        return None
    _, source, axes = next(b for b in branches.values() if b is not None and b[0] == "Squeeze")
    shape = dims.get(source)
    if shape is None or axes is None:
        return None
    axes = [a % len(shape) for a in axes]
    known = [shape[a] for a in axes]
    if any(d is None for d in known):
        return None
    if all(d == 1 for d in known):
        axes_name = f"{node.name or node.output[0]}_folded_axes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name))
        return [
            helper.make_node("Squeeze", [source, axes_name], [node.output[0]], name=f"{node.name}_folded")
        ]
    return [helper.make_node("Identity", [source], [node.output[0]], name=f"{node.name}_folded")]


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    names: set[str] = set()
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in g.node:
                names.update(inner.input)
                names.update(_subgraph_inputs(inner))
    return names


def remove_dead_nodes(model: onnx.ModelProto) -> int:
    """Drop nodes (and initializers) no graph output depends on; returns how many nodes went."""
    graph = model.graph
    live = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(list(graph.node)):
        if any(o in live for o in node.output):
            kept.append(node)
            live.update(node.input)
            live.update(_subgraph_inputs(node))
    removed = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    inits = [i for i in graph.initializer if i.name in live]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    return removed


# --- checks ----------------------------------------------------------------------------------------------
def trace_length_for(avoid: set[int], start: int = 29) -> int:
    """A prime sequence length for tracing whose derived sizes (T-1, T+1, 2T, 2T-1) collide with no model
    dimension, so a constant equal to one of them can only come from shape specialisation."""

    def is_prime(n: int) -> bool:
        return n > 1 and all(n % k for k in range(2, int(n**0.5) + 1))

    n = start
    while not is_prime(n) or {n, n - 1, n + 1, 2 * n, 2 * n - 1} & avoid:
        n += 1
    return n


def check_graph(model: onnx.ModelProto, trace_len: int | None = None) -> None:
    """Raise GraphCheckError listing forbidden ops and constants specialised to the trace length."""
    problems: list[str] = []
    counts = op_counts(model)
    bad = {op: counts[op] for op in FORBIDDEN_OPS if op in counts}
    if bad:
        problems.append(f"forbidden ops in the graph: {bad}")
    if trace_len is not None:
        suspicious = {trace_len, trace_len - 1, trace_len + 1, 2 * trace_len, 2 * trace_len - 1}
        consts = _constant_values(model)
        for node in model.graph.node:
            for i, name in enumerate(node.input):
                if (node.op_type, i) in SHAPE_INPUTS and name in consts:
                    values = np.atleast_1d(consts[name]).astype(np.int64).tolist()
                    if set(values) & suspicious:
                        problems.append(
                            f"{node.op_type} node {node.name!r} has a constant {values} derived from the "
                            f"trace length {trace_len} (shape specialised)"
                        )
    if problems:
        raise GraphCheckError("; ".join(problems))


def fp32_island(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes computing the sinusoid table: Sin/Cos, all their ancestors, and the Concat after."""
    producer = {o: n for n in model.graph.node for o in n.output}
    seeds = [n for n in model.graph.node if n.op_type in ("Sin", "Cos")]
    seed_outputs = {o for n in seeds for o in n.output}
    island = {n.name for n in model.graph.node if n.op_type == "Concat" and seed_outputs & set(n.input)}
    stack = list(seeds)
    while stack:
        node = stack.pop()
        if node.name in island and node.op_type not in ("Sin", "Cos"):
            continue
        island.add(node.name)
        stack.extend(producer[i] for i in node.input if i in producer and producer[i].name not in island)
    return sorted(island)


def ensure_node_names(model: onnx.ModelProto) -> None:
    """Give every node a unique name (block lists and TensorRT layer matching go by name)."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
