"""Build a TensorRT engine from an ONNX export directory and write a TensorRT export directory.

    python -m export.trt --onnx exports/onnx --out exports/trt [--min-shape 1x1] --opt-shape 8x384 \\
        --max-shape 32x512 [--fp16] [--timing-cache FILE] [--workspace-gb N] [--no-verify]

The engine is built from the export's standard-ops graph (`portable_model_file`: TensorRT cannot parse
onnxruntime's contrib ops), with one optimisation profile covering [min, max] batch x sequence for all
three inputs. The profile is checked against the graph: its sequence range must hold the serving windows
(max_seq_len) and stay within the relative-position tables the export precomputed (`position_limit`:
512 positions, `QAInference`'s cache), and the beam head's in-graph top-k needs at least k tokens. The
default minimum is the smallest shape the graph accepts (1x1, 1xk for the beam head), because Triton
serves a plan's profile as it is and rejects, never pads, a shorter request.

Precision paths (printed, and recorded as `trt.path` in export.json):

- "fp32":           fp32 graph, no reduced precision (TF32 off unless --tf32, so fp32 means fp32).
- "strongly-typed": an fp16 graph (`export.onnx --precision fp16`) on any TensorRT; from TensorRT 10.12
                    on (10.12 deprecated weak typing, 11.x removed it) also --fp16 on an fp32 graph, which
                    is converted on the fly (`export.onnx.precision.to_fp16`, which keeps sinusoid nodes, where
                    a graph computes them, in fp32: `export.onnx.graph.fp32_island`). Built as a strongly typed
                    network (NetworkDefinitionCreationFlag.STRONGLY_TYPED) that keeps the graph's types.
- "fp16-flag":      TensorRT 10.0-10.11 only (an engine for an older Triton container) with --fp16 on an
                    fp32 graph: `BuilderFlag.FP16` (weak typing). Sinusoid nodes, where a graph computes
                    them, are constrained to fp32 (PREFER_PRECISION_CONSTRAINTS). The pinned TensorRT
                    (export/gpu_versions.py) never takes this path.

Exports of `QAInference` have no sinusoid nodes: their position tables were computed in fp32 at export
and are constants (weights) like any other.

Without the `tensorrt` module or a usable CUDA GPU (none, or a driver too old for the CUDA runtime) the
command prints one line saying which is missing and how to get it, and exits with code 2. The engine
is checked against onnxruntime (CPU) on the source graph. A timing cache from another TensorRT version
or GPU is refused by TensorRT; the build then starts from an empty cache (with a warning) and overwrites
the file. Torch-free: the GPU's name comes from cuda-bindings.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from export.gpu_versions import tensorrt_release
from export.runtime.gpu import gpu_stack_problem
from export.runtime.sidecar import SIDECAR_FILE, TOKENIZER_FILES, Sidecar
from train.common.atomic_dir import atomic_write_bytes
from train.common.cli import Parser, run
from train.common.contract import INPUT_NAMES, shortest_sequence

PROG = "python -m export.trt"
ENGINE_FILE = "model.engine"
TOLERANCE = {"fp32": 1e-3, "fp16": 5e-2}  # x max(1, max |reference output|), per output


def parse_shape(text: str) -> list[int]:
    """'8x384' -> [8, 384] (batch x sequence)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) != 2 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"expected BATCHxSEQUENCE like 8x384, got {text!r}")
    return parts


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Build a TensorRT engine from an ONNX export directory.")
    p.add_argument("--onnx", required=True, help="ONNX export directory (python -m export.onnx)")
    p.add_argument("--out", required=True, help="TensorRT export directory to write")
    p.add_argument(
        "--min-shape",
        type=parse_shape,
        help="smallest BATCHxSEQUENCE (default: the smallest the graph accepts, 1x1 or 1xk for the beam head)",
    )
    p.add_argument("--opt-shape", type=parse_shape, default="8x384", help="BATCHxSEQUENCE to tune for")
    p.add_argument("--max-shape", type=parse_shape, default="32x512", help="largest BATCHxSEQUENCE")
    p.add_argument(
        "--fp16", action="store_true", help="fp16 engine (strongly typed; see the module doc for older 10.x)"
    )
    p.add_argument(
        "--tf32", action="store_true", help="allow TF32 matmuls in fp32 layers (faster, ~1e-3 error)"
    )
    p.add_argument("--timing-cache", help="timing cache file: loaded if present, saved after the build")
    p.add_argument(
        "--workspace-gb", type=float, default=4.0, help="builder workspace memory pool limit (GiB)"
    )
    p.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip the engine-vs-onnxruntime check"
    )
    return p


def check_args(args: argparse.Namespace) -> None:
    lo, opt, hi = args.min_shape or [1, 1], args.opt_shape, args.max_shape
    if not all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)):
        raise ValueError(f"shapes must satisfy min <= opt <= max per dimension, got {lo}, {opt}, {hi}")
    if args.workspace_gb <= 0:
        raise ValueError("--workspace-gb must be positive")


def min_sequence(sidecar: Sidecar) -> int:
    """The shortest sequence the graph runs: the beam head takes top-k over the sequence inside the graph."""
    return shortest_sequence(sidecar.head, sidecar.start_n_top, sidecar.end_n_top)


def position_limit(model: Any, d_model: int) -> int | None:
    """The longest sequence an exported graph can run, or None if it sets no limit.

    `QAInference` precomputes each layer's projected relative positions for 512 tokens and the graph
    slices the middle 2T rows of these [1, n_head, 2 x limit, d_head] constants; a longer input gets a
    short slice and fails (onnxruntime: a Reshape error at 513 tokens). A graph that computes the
    sinusoids itself (no tables) has no limit of its own.
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
        if len(dims) == 4 and dims[0] == 1 and dims[1] * dims[3] == d_model and dims[2] % 2 == 0:
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


def check_profile_fits(args: argparse.Namespace, sidecar: Sidecar, limit: int | None) -> None:
    """The profile against what the graph and the serving settings need (after --min-shape has its default)."""
    lo, hi = args.min_shape, args.max_shape
    if hi[1] < sidecar.max_seq_len:
        raise ValueError(
            f"--max-shape sequence {hi[1]} is shorter than the export's max_seq_len "
            f"{sidecar.max_seq_len}: serving windows would not fit the engine"
        )
    if limit is not None and hi[1] > limit:
        raise ValueError(
            f"--max-shape sequence {hi[1]} exceeds the {limit} positions the exported graph holds (its "
            f"relative-position tables were precomputed for {limit} tokens): use --max-shape {hi[0]}x{limit}"
        )
    need = min_sequence(sidecar)
    if lo[1] < need:
        raise ValueError(
            f"--min-shape sequence {lo[1]} is shorter than the beam head's top-k ({need}): the graph needs "
            f"at least {need} tokens; use --min-shape {lo[0]}x{need}"
        )
    if not all(a <= b for a, b in zip(lo, args.opt_shape, strict=True)):
        raise ValueError(f"--min-shape {lo} exceeds --opt-shape {args.opt_shape}")


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


# TensorRT 10.12 deprecated the weak typing APIs (BuilderFlag.FP16 among them); 11.x removed them.
STRONG_FP16_SINCE = (10, 12)


def choose_path(trt_release: Sequence[int], fp16: bool, graph_precision: str) -> tuple[str, str]:
    """(build path, engine precision) for a TensorRT release (major, minor[, patch]), --fp16 and the graph's
    precision: fp16 is strongly typed from TensorRT 10.12 on, the FP16 builder flag before."""
    if graph_precision == "fp16":
        return "strongly-typed", "fp16"
    if not fp16:
        return "fp32", "fp32"
    strong = tuple(trt_release[:2]) >= STRONG_FP16_SINCE
    return ("strongly-typed", "fp16") if strong else ("fp16-flag", "fp16")


def build_engine(
    args: argparse.Namespace, graph: Path, path: str, graph_precision: str, work: Path
) -> tuple[bytes, dict[str, Any]]:
    """Parse, configure and build; returns the serialized engine and facts for the sidecar."""
    import onnx
    import tensorrt as trt

    from export.onnx.graph import fp32_island
    from export.onnx.precision import to_fp16

    if path == "strongly-typed" and graph_precision != "fp16":  # --fp16 on an fp32 export
        converted = work / "model.fp16.onnx"
        onnx.save(to_fp16(onnx.load(str(graph))), str(converted))
        print(f"converted {graph.name} to fp16 for the strongly typed build (export.onnx.precision.to_fp16)")
        graph = converted
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if path == "strongly-typed" else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(graph)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BuildFailed(f"TensorRT could not parse {graph.name}:\n  " + "\n  ".join(errors))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(args.workspace_gb * (1 << 30)))
    if not args.tf32 and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    constrained = 0
    if path == "fp16-flag":
        config.set_flag(trt.BuilderFlag.FP16)
        config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
        constrained = keep_fp32(network, set(fp32_island(onnx.load(str(graph)))), trt)
    profile = builder.create_optimization_profile()
    for name in INPUT_NAMES:
        profile.set_shape(name, tuple(args.min_shape), tuple(args.opt_shape), tuple(args.max_shape))
    config.add_optimization_profile(profile)
    cache_file = Path(args.timing_cache) if args.timing_cache else None
    timing = load_timing_cache(config, cache_file)  # the config does not own it: held until saved
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildFailed("TensorRT build_serialized_network failed (see the TensorRT log above)")
    if cache_file:
        save_timing_cache(config, cache_file, timing.state)
    del timing  # the build is done and the cache saved: it may go now
    facts = {
        "source_onnx": graph.name,
        "fp32_constrained_layers": constrained,
        "timing_cache": str(cache_file or ""),
    }
    return bytes(memoryview(serialized)), facts


class TimingCache(NamedTuple):
    """A timing cache attached to a builder config. The config does not own it (TensorRT: the cache must
    not be destroyed until after the engine is built), so the builder holds this until the build is done."""

    state: str  # "loaded", "empty" (no file) or "replaced" (a file TensorRT refused)
    cache: Any  # the tensorrt.ITimingCache


def load_timing_cache(config: Any, cache_file: Path | None) -> TimingCache:
    """Attach a timing cache to a builder config: the file's when TensorRT accepts it, else an empty one.

    TensorRT checks a serialized cache's header against its own version and the GPU; `set_timing_cache`
    returns False on a mismatch (and `create_timing_cache` may give None for bytes it cannot read), which
    would otherwise go unnoticed. Returns the attached cache, which must outlive the build.
    """
    data = cache_file.read_bytes() if cache_file is not None and cache_file.is_file() else b""
    if data:
        try:
            cache = config.create_timing_cache(data)
        except Exception:  # noqa: BLE001 - TensorRT's binding errors have no common public type
            cache = None
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            print(f"timing cache loaded: {cache_file} ({len(data)} bytes)")
            return TimingCache("loaded", cache)
        print(
            f"WARNING: timing cache {cache_file} was made by another TensorRT/GPU; starting with an empty one "
            "(the file is replaced after the build)",
            file=sys.stderr,
        )
    empty = config.create_timing_cache(b"")
    if empty is None or not config.set_timing_cache(empty, ignore_mismatch=False):
        raise BuildFailed("TensorRT could not attach an empty timing cache to the builder config")
    return TimingCache("replaced" if data else "empty", empty)


def save_timing_cache(config: Any, cache_file: Path, state: str) -> bool:
    """Write the builder config's timing cache atomically; False (with a warning) if TensorRT has none."""
    cache = config.get_timing_cache()
    serialized = cache.serialize() if cache is not None else None
    if serialized is None:
        print(
            f"WARNING: TensorRT returned no timing cache after the build; {cache_file} is not written",
            file=sys.stderr,
        )
        return False
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(cache_file, bytes(memoryview(serialized)))
    print(f"timing cache {'updated' if state == 'loaded' else 'written'}: {cache_file}")
    return True


def onnx_nodes_of(layer) -> set[str]:
    """ONNX node names a TensorRT layer came from: its name and the parser's `[ONNX Layer: name | ...]` metadata."""
    names = {layer.name}
    for chunk in (getattr(layer, "metadata", "") or "").split("[ONNX Layer: ")[1:]:
        names.add(chunk.split("]")[0].split(" | ")[0].strip())
    return names


def keep_fp32(network: Any, island: set[str], trt: Any) -> int:
    """Constrain the layers made from the sinusoid nodes to fp32 (weakly typed fp16 builds).

    An export of `QAInference` has no such nodes: its position tables are constants computed in fp32 at
    export time, so there is nothing to constrain and no warning; one is printed only when the graph has
    sinusoid nodes but no TensorRT layer came from them (TensorRT then picks their precision).
    """
    if not island:
        print(
            "fp16: no sinusoid nodes in the graph (its position tables are precomputed constants); no layer needs fp32"
        )
        return 0
    count = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if not onnx_nodes_of(layer) & island:
            continue
        layer.precision = trt.float32
        for j in range(layer.num_outputs):
            if layer.get_output(j).dtype in (trt.float32, trt.float16):
                layer.set_output_type(j, trt.float32)
        count += 1
    if not count:
        print(
            f"WARNING: none of the {len(island)} sinusoid nodes matched a TensorRT layer; TensorRT picks their "
            "precision",
            file=sys.stderr,
        )
    else:
        print(f"fp16: {count} layers from the {len(island)} sinusoid nodes constrained to fp32")
    return count


class BuildFailed(RuntimeError):
    """TensorRT could not parse or build the network (exit code 1)."""


def verify_engine(
    runner_, graph: Path, sidecar: Sidecar, args: argparse.Namespace, precision: str
) -> dict[str, Any]:
    """Engine (TRTRunner) vs onnxruntime CPU on the source graph at shapes spanning the profile."""
    from export.onnx.verify import compare, run_all, sample_batches
    from export.runtime.sessions import runner, session
    from train.tokenizer import XLNetTokenizer

    lo, opt, hi = args.min_shape, args.opt_shape, args.max_shape
    mid = (min(max(2, lo[0]), hi[0]), min(max(64, lo[1]), hi[1]))
    shapes = [tuple(lo), mid, tuple(opt), (lo[0], hi[1])]
    batches = sample_batches(XLNetTokenizer.from_dir(runner_.dir), shapes, sidecar.vocab_size)
    names = sidecar.outputs
    reference = run_all(runner(session(graph), names), batches)
    got = run_all(runner_.runner(), batches)
    # Relative to each output's magnitude, as export.onnx verifies: trained logits reach tens.
    tol = TOLERANCE[precision]
    result = compare(names, reference, got, tol, exact_indices=precision == "fp32", relative=True)
    print(f"verify TensorRT engine vs onnxruntime at shapes {[list(s) for s in shapes]}:")
    print("\n".join(result.lines()))
    print(f"  -> {'passed' if result.passed else 'FAILED: ' + '; '.join(result.problems)}")
    record = {
        "shapes": [list(s) for s in shapes],
        "max_abs_diff": result.max_abs_diff,
        "fraction_equal": result.fraction_equal,
        "tolerance": result.tolerance,
        "passed": result.passed,
        "reference": f"onnxruntime CPU on {graph.name}",
    }
    record["tolerance_is_relative_to"] = result.scale
    return record


def engine_sidecar(sidecar: Sidecar, args: argparse.Namespace, path: str, precision: str, facts) -> Sidecar:
    """The ONNX export's sidecar, re-pointed at the engine, with the build recorded under `trt`."""
    import tensorrt as trt

    from export.trt.cuda import device_name

    data = sidecar.to_dict()
    for key in ("portable_model_file", "optimization", "quantization", "agreement"):
        data.pop(key, None)
    data.update(
        backend="tensorrt",
        model_file=ENGINE_FILE,
        precision=precision,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        exporter={**sidecar.exporter, "tensorrt": trt.__version__},
        verification={"passed": None, "skipped": "--no-verify"},
        trt={
            "min_shape": list(args.min_shape),
            "opt_shape": list(args.opt_shape),
            "max_shape": list(args.max_shape),
            "version": trt.__version__,
            "path": path,
            "tf32": bool(args.tf32),
            "workspace_gb": args.workspace_gb,
            "device": device_name(),
            "source_export": str(Path(args.onnx).resolve()),
            **facts,
        },
    )
    return Sidecar.from_dict(data)


def build(args: argparse.Namespace) -> int:
    check_args(args)
    onnx_dir, out = Path(args.onnx), Path(args.out)
    sidecar = Sidecar.load(onnx_dir)
    graph = source_graph(onnx_dir, sidecar)
    if args.min_shape is None:
        args.min_shape = [1, min_sequence(sidecar)]
    limit = graph_position_limit(graph, sidecar)
    check_profile_fits(args, sidecar, limit)
    problem = gpu_stack_problem()
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    import tensorrt as trt

    from export.trt.cuda import device_name
    from export.trt.runtime import TRTRunner
    from train.common.atomic_dir import atomic_directory

    release = tensorrt_release(trt.__version__)
    if release is None:
        print(
            f"{PROG}: error: TensorRT's version {trt.__version__!r} is not MAJOR.MINOR.PATCH", file=sys.stderr
        )
        return 2
    path, precision = choose_path(release, args.fp16, sidecar.precision)
    print(
        f"{PROG}: TensorRT {trt.__version__} on {device_name()}: building a {precision} engine "
        f"via the {path!r} path from {graph}, profile {args.min_shape} .. {args.max_shape}"
    )
    try:
        with atomic_directory(out) as tmp:
            with tempfile.TemporaryDirectory() as work:
                engine, facts = build_engine(args, graph, path, sidecar.precision, Path(work))
            facts["position_limit"] = limit
            (tmp / ENGINE_FILE).write_bytes(engine)
            for name in TOKENIZER_FILES:
                shutil.copyfile(onnx_dir / name, tmp / name)
            built = engine_sidecar(sidecar, args, path, precision, facts)
            built.save(tmp)
            runner_ = TRTRunner(tmp)
            try:
                assert built.trt is not None  # engine_sidecar always sets it
                built.trt["io_dtypes"] = runner_.io_dtypes()  # Triton's config needs the engine's I/O types
                if args.verify:
                    built.verification = verify_engine(runner_, graph, built, args, precision)
            finally:
                runner_.close()
            built.save(tmp)
            if not built.verification["passed"] and args.verify:
                raise BuildFailed("the engine does not reproduce onnxruntime within the tolerance")
    except BuildFailed as exc:
        print(f"{PROG}: error: {exc}; nothing written", file=sys.stderr)
        return 1
    print(f"wrote {out}/: {ENGINE_FILE}, {SIDECAR_FILE}, spiece.model, tokenizer_config.json")
    return 0


def _main(argv: Sequence[str] | None) -> int:
    return build(build_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: user errors and a missing GPU stack -> one line and exit 2; a failed build -> exit 1."""
    return run(_main, argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
