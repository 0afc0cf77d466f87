"""The optimisation profile of a TensorRT build, checked against the ONNX export it is built from.

A profile is one [min, opt, max] range of batch x sequence shared by the three inputs. Its sequence range
must hold the serving windows (`max_seq_len`) and stay within the relative-position tables the export
precomputed (:func:`position_limit`: 512 positions, `QAInference`'s cache), and the beam head's in-graph
top-k needs at least k tokens (:func:`min_sequence`). Torch- and TensorRT-free: `export.triton` checks a
plan's profile with the same rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from qa_core.contract import shortest_sequence
from qa_core.runtime.sidecar import Sidecar

Shape = tuple[int, int]  # batch x sequence


def parse_shape(text: str) -> Shape:
    """'8x384' -> (8, 384) (batch x sequence); ValueError for anything else."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) != 2 or min(parts) < 1:
        raise ValueError(f"expected BATCHxSEQUENCE like 8x384, got {text!r}")
    return parts[0], parts[1]


def check_order(lo: Shape, opt: Shape, hi: Shape) -> None:
    """min <= opt <= max in each dimension."""
    if not all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)):
        raise ValueError(
            f"shapes must satisfy min <= opt <= max per dimension, got {list(lo)}, {list(opt)}, {list(hi)}"
        )


class Profile(NamedTuple):
    """The shapes one optimisation profile covers (the minimum resolved against the graph)."""

    min: Shape
    opt: Shape
    max: Shape

    def record(self) -> dict[str, list[int]]:
        """The profile as export.json's `trt` records it."""
        return {"min_shape": list(self.min), "opt_shape": list(self.opt), "max_shape": list(self.max)}


def min_sequence(sidecar: Sidecar) -> int:
    """The shortest sequence the graph runs: the beam head takes top-k over the sequence inside the graph."""
    return shortest_sequence(sidecar.head, sidecar.serving.start_n_top, sidecar.serving.end_n_top)


def position_limit(model: Any, d_model: int) -> int | None:
    """The longest sequence an exported graph can run, or None if it sets no limit.

    `QAInference` precomputes each layer's projected relative positions for 512 tokens and the graph
    slices the 2T distances of a window out of these [1, n_head, 2 x limit, d_head (+ 1: the fused
    layer's position-bias column)] constants; a longer input gets a short slice and fails. A graph that
    computes the sinusoids itself (no tables) has no limit of its own.
    """
    inits = {init.name: init for init in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    limits = []
    for node in model.graph.node:
        if node.op_type != "Slice" or not node.input:
            continue
        source = node.input[0]
        while source not in inits and source in producer and producer[source].op_type in ("Cast", "Identity"):
            source = producer[source].input[0]
        dims = list(inits[source].dims) if source in inits else []
        if len(dims) != 4 or dims[0] != 1 or dims[1] < 1 or d_model % dims[1]:
            continue
        if dims[3] - d_model // dims[1] in (0, 1) and dims[2] % 2 == 0:
            limits.append(dims[2] // 2)
    return min(limits) if limits else None


def graph_position_limit(graph: Path, sidecar: Sidecar) -> int | None:
    """:func:`position_limit` of an ONNX file (initializer shapes only: external data is not loaded)."""
    import onnx

    try:
        model = onnx.load(str(graph), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf decode errors have no common public type
        raise ValueError(f"cannot read {graph} as an ONNX model ({type(exc).__name__}: {exc})") from None
    return position_limit(model, sidecar.d_model)


def check_profile_fits(profile: Profile, sidecar: Sidecar, limit: int | None) -> None:
    """The profile against what the graph and the serving settings need (its minimum resolved)."""
    lo, hi = profile.min, profile.max
    if hi[1] < sidecar.serving.max_seq_len:
        raise ValueError(
            f"--max-shape sequence {hi[1]} is shorter than the export's max_seq_len "
            f"{sidecar.serving.max_seq_len}: serving windows would not fit the engine"
        )
    if limit is not None and hi[1] > limit:
        raise ValueError(
            f"--max-shape sequence {hi[1]} exceeds the {limit} positions the exported graph holds (its "
            f"relative-position tables were precomputed for {limit} tokens): use --max-shape {hi[0]}x{limit}"
        )
    need = min_sequence(sidecar)
    if lo[1] < need:
        raise ValueError(
            f"--min-shape sequence {lo[1]} is shorter than the graph runs ({need} tokens: its position term's "
            f"chunks each need a row, a beam head's top-k its k; the server pads shorter windows); use "
            f"--min-shape {lo[0]}x{need}"
        )
    if not all(a <= b for a, b in zip(lo, profile.opt, strict=True)):
        raise ValueError(f"--min-shape {list(lo)} exceeds --opt-shape {list(profile.opt)}")


def source_graph(onnx_dir: Path, sidecar: Sidecar) -> Path:
    """The standard-ops graph of an ONNX export (int8 dynamic quantization is onnxruntime-only)."""
    if sidecar.backend != "onnx":
        raise ValueError(f"--onnx {onnx_dir}: is a {sidecar.backend!r} export, not an ONNX one")
    if sidecar.precision == "int8" or not sidecar.portable_model_file:
        raise ValueError(
            f"--onnx {onnx_dir}: a {sidecar.precision} export has no standard-ops graph for TensorRT (dynamic int8 "
            "runs on onnxruntime only); export fp32 or fp16 for TensorRT"
        )
    return onnx_dir / sidecar.portable_model_file
