"""Build a TensorRT engine from an ONNX export directory and write a TensorRT export directory.

The library behind ``python -m export.trt`` (`export.trt.cli` is its command line), callable without
argparse: ``build_trt(TrtBuildOptions(onnx=..., out=...))``. Progress lines go to `report` (stdout unless
given), warnings to `warn` (stderr unless given).

The engine is built from the export's standard-ops graph (`portable_model_file`: TensorRT cannot parse
onnxruntime's contrib ops), with one optimisation profile covering [min, max] batch x sequence for all
three inputs, checked against the graph (`export.trt.profile`). The default minimum is the smallest
shape the graph accepts (1x4, 1xk for a beam head with k > 4), because Triton serves a plan's profile as it is
and rejects, never pads, a shorter request.

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
                    (qa_core/runtime/gpu_stacks.py) never takes this path.

Exports of `QAInference` have no sinusoid nodes: their position tables were computed in fp32 at export
and are constants (weights) like any other.

Without the `tensorrt` module or a usable CUDA GPU (none, or a driver too old for the CUDA runtime)
:class:`StackUnavailable` says which is missing and how to get it (the command: one line, exit code 2).
The engine is checked against onnxruntime (CPU) on the source graph. A timing cache from another
TensorRT version or GPU is refused by TensorRT; the build then starts from an empty cache (with a
warning) and overwrites the file. Torch-free: the GPU's name comes from cuda-bindings.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from export.trt.profile import (
    Profile,
    Shape,
    check_order,
    check_profile_fits,
    graph_position_limit,
    min_sequence,
    parse_shape,
    source_graph,
)
from qa_core.contract import INPUT_NAMES
from qa_core.runtime.backends import TRT
from qa_core.runtime.gpu import gpu_stack_problem
from qa_core.runtime.gpu_stacks import tensorrt_release
from qa_core.runtime.sidecar import SIDECAR_FILE, TOKENIZER_FILES, Sidecar
from train.common.atomic_dir import atomic_write_bytes
from train.common.cli import to_stderr
from train.common.dataclass_flags import flag

PROG = "python -m export.trt"  # the command that runs this builder; its first progress line names it
ENGINE_FILE = "model.engine"
TOLERANCE = {"fp32": 1e-3, "fp16": 5e-2}  # x max(1, max |reference output|), per output

Report = Callable[[str], None]


class BuildFailed(RuntimeError):
    """TensorRT could not parse or build the network, or the engine does not verify (exit code 1)."""


class StackUnavailable(RuntimeError):
    """No usable TensorRT or CUDA GPU here; the message says which and how to get it (exit code 2)."""


def shape_flag(text: str) -> Shape:
    """'8x384' -> (8, 384); argparse's one-line error for anything else."""
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class TrtBuildOptions:
    """What to build and how; checked on construction, so bad values fail before any work.

    Each field is a flag of ``python -m export.trt`` (:mod:`train.common.dataclass_flags`). Shapes are (batch, sequence); `min_shape` None: the smallest shape
    the graph accepts (1x4, 1xk for a beam head with k > 4). `timing_cache`: loaded if present, saved after the
    build. `tf32` allows TF32 matmuls in fp32 layers; `verify` checks the engine against onnxruntime.
    """

    onnx: Path = flag(help="ONNX export directory (python -m export.onnx)")
    out: Path = flag(help="TensorRT export directory to write")
    min_shape: Shape | None = flag(
        None,
        parse=shape_flag,
        metavar="BxS",
        help="smallest BATCHxSEQUENCE (default: the smallest the graph accepts, 1x4, or 1xk for a beam head with k > 4)",
    )
    opt_shape: Shape = flag((8, 384), parse=shape_flag, metavar="BxS", help="BATCHxSEQUENCE to tune for")
    max_shape: Shape = flag((32, 512), parse=shape_flag, metavar="BxS", help="largest BATCHxSEQUENCE")
    fp16: bool = flag(False, help="fp16 engine (strongly typed; see the module doc for older 10.x)")
    tf32: bool = flag(False, help="allow TF32 matmuls in fp32 layers (faster, ~1e-3 error)")
    timing_cache: Path | None = flag(None, help="timing cache file: loaded if present, saved after the build")
    workspace_gb: float = flag(4.0, help="builder workspace memory pool limit (GiB)")
    verify: bool = flag(True, help="check the engine against onnxruntime")

    def __post_init__(self) -> None:
        for name in ("min_shape", "opt_shape", "max_shape"):
            shape = getattr(self, name)
            if shape is not None:
                object.__setattr__(self, name, (int(shape[0]), int(shape[1])))
        check_order(self.min_shape or (1, 1), self.opt_shape, self.max_shape)
        if self.workspace_gb <= 0:
            raise ValueError("--workspace-gb must be positive")

    def profile(self, sidecar: Sidecar) -> Profile:
        """The optimisation profile, its minimum defaulting to the smallest shape the graph accepts."""
        lo = self.min_shape or (1, min_sequence(sidecar))
        return Profile(lo, self.opt_shape, self.max_shape)


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


class BuildPlan(NamedTuple):
    """What was decided before building: the source, its profile and position limit, and the build path."""

    sidecar: Sidecar
    graph: Path
    profile: Profile
    limit: int | None
    path: str
    precision: str


def plan_build(options: TrtBuildOptions, report: Report = print) -> BuildPlan:
    """Check the export and the profile, then the GPU stack; choose the build path and announce it."""
    onnx_dir = Path(options.onnx)
    sidecar = Sidecar.load(onnx_dir)
    graph = source_graph(onnx_dir, sidecar)
    profile = options.profile(sidecar)
    limit = graph_position_limit(graph, sidecar)
    check_profile_fits(profile, sidecar, limit)
    problem = gpu_stack_problem()
    if problem:
        raise StackUnavailable(problem)
    import tensorrt as trt

    from export.trt.cuda import device_name

    release = tensorrt_release(trt.__version__)
    if release is None:
        raise StackUnavailable(f"TensorRT's version {trt.__version__!r} is not MAJOR.MINOR.PATCH")
    path, precision = choose_path(release, options.fp16, sidecar.precision)
    report(
        f"{PROG}: TensorRT {trt.__version__} on {device_name()}: building a {precision} engine "
        f"via the {path!r} path from {graph}, profile {list(profile.min)} .. {list(profile.max)}"
    )
    return BuildPlan(sidecar, graph, profile, limit, path, precision)


def build_engine(
    options: TrtBuildOptions, plan: BuildPlan, work: Path, report: Report = print, warn: Report = to_stderr
) -> tuple[bytes, dict[str, Any]]:
    """Parse, configure and build; returns the serialized engine and facts for the sidecar."""
    import onnx
    import tensorrt as trt

    from export.onnx.graph import fp32_island
    from export.onnx.precision import to_fp16

    graph, path, profile = plan.graph, plan.path, plan.profile
    if path == "strongly-typed" and plan.sidecar.precision != "fp16":  # --fp16 on an fp32 export
        converted = work / "model.fp16.onnx"
        onnx.save(to_fp16(onnx.load(str(graph))), str(converted))
        report(f"converted {graph.name} to fp16 for the strongly typed build (export.onnx.precision.to_fp16)")
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
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace_gb * (1 << 30)))
    if not options.tf32 and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    constrained = 0
    if path == "fp16-flag":
        config.set_flag(trt.BuilderFlag.FP16)
        config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
        island = set(fp32_island(onnx.load(str(graph))))
        constrained = keep_fp32(network, island, trt, report=report, warn=warn)
    shapes = builder.create_optimization_profile()
    for name in INPUT_NAMES:
        shapes.set_shape(name, profile.min, profile.opt, profile.max)
    config.add_optimization_profile(shapes)
    cache_file = Path(options.timing_cache) if options.timing_cache else None
    timing = load_timing_cache(config, cache_file, report=report, warn=warn)  # held until saved
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildFailed("TensorRT build_serialized_network failed (see the TensorRT log above)")
    if cache_file:
        save_timing_cache(config, cache_file, timing.state, report=report, warn=warn)
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


def load_timing_cache(
    config: Any, cache_file: Path | None, report: Report = print, warn: Report = to_stderr
) -> TimingCache:
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
            report(f"timing cache loaded: {cache_file} ({len(data)} bytes)")
            return TimingCache("loaded", cache)
        warn(
            f"WARNING: timing cache {cache_file} was made by another TensorRT/GPU; starting with an empty one "
            "(the file is replaced after the build)"
        )
    empty = config.create_timing_cache(b"")
    if empty is None or not config.set_timing_cache(empty, ignore_mismatch=False):
        raise BuildFailed("TensorRT could not attach an empty timing cache to the builder config")
    return TimingCache("replaced" if data else "empty", empty)


def save_timing_cache(
    config: Any, cache_file: Path, state: str, report: Report = print, warn: Report = to_stderr
) -> bool:
    """Write the builder config's timing cache atomically; False (with a warning) if TensorRT has none."""
    cache = config.get_timing_cache()
    serialized = cache.serialize() if cache is not None else None
    if serialized is None:
        warn(f"WARNING: TensorRT returned no timing cache after the build; {cache_file} is not written")
        return False
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(cache_file, bytes(memoryview(serialized)))
    report(f"timing cache {'updated' if state == 'loaded' else 'written'}: {cache_file}")
    return True


def onnx_nodes_of(layer) -> set[str]:
    """ONNX node names a TensorRT layer came from: its name and the parser's `[ONNX Layer: name | ...]` metadata."""
    names = {layer.name}
    for chunk in (getattr(layer, "metadata", "") or "").split("[ONNX Layer: ")[1:]:
        names.add(chunk.split("]")[0].split(" | ")[0].strip())
    return names


def keep_fp32(
    network: Any, island: set[str], trt: Any, report: Report = print, warn: Report = to_stderr
) -> int:
    """Constrain the layers made from the sinusoid nodes to fp32 (weakly typed fp16 builds).

    An export of `QAInference` has no such nodes: its position tables are constants computed in fp32 at
    export time, so there is nothing to constrain and no warning; one is printed only when the graph has
    sinusoid nodes but no TensorRT layer came from them (TensorRT then picks their precision).
    """
    if not island:
        report(
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
        warn(
            f"WARNING: none of the {len(island)} sinusoid nodes matched a TensorRT layer; TensorRT picks their "
            "precision"
        )
    else:
        report(f"fp16: {count} layers from the {len(island)} sinusoid nodes constrained to fp32")
    return count


def verify_engine(runner_: Any, plan: BuildPlan, report: Report = print) -> dict[str, Any]:
    """Engine (TRTRunner) vs onnxruntime CPU on the source graph at shapes spanning the profile."""
    from export.onnx.verify import compare, run_all, sample_batches
    from qa_core.runtime.sessions import runner, session
    from qa_core.tokenizer import XLNetTokenizer

    graph, precision = plan.graph, plan.precision
    lo, opt, hi = plan.profile
    mid = (min(max(2, lo[0]), hi[0]), min(max(64, lo[1]), hi[1]))
    shapes = [lo, mid, opt, (lo[0], hi[1])]
    batches = sample_batches(XLNetTokenizer.from_dir(runner_.dir), shapes, plan.sidecar.vocab_size)
    names = plan.sidecar.outputs
    reference = run_all(runner(session(graph), names), batches)
    got = run_all(runner_.runner(), batches)
    # Relative to each output's magnitude, as export.onnx verifies: trained logits reach tens.
    tol = TOLERANCE[precision]
    result = compare(names, reference, got, tol, exact_indices=precision == "fp32", relative=True)
    for line in result.summary(
        f"verify TensorRT engine vs onnxruntime at shapes {[list(s) for s in shapes]}:"
    ):
        report(line)
    return {**result.record(shapes), "reference": f"onnxruntime CPU on {graph.name}"}


def engine_sidecar(options: TrtBuildOptions, plan: BuildPlan, facts: dict[str, Any]) -> Sidecar:
    """The ONNX export's sidecar, re-pointed at the engine, with the build recorded under `trt`."""
    import tensorrt as trt

    from export.trt.cuda import device_name

    sidecar = plan.sidecar
    data = sidecar.to_dict()
    for key in ("portable_model_file", "optimization", "quantization", "agreement"):
        data.pop(key, None)
    data.update(
        backend=TRT,
        model_file=ENGINE_FILE,
        precision=plan.precision,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        exporter={**sidecar.exporter, "tensorrt": trt.__version__},
        verification={"passed": None, "skipped": "--no-verify"},
        trt={
            **plan.profile.record(),
            "version": trt.__version__,
            "path": plan.path,
            "tf32": bool(options.tf32),
            "workspace_gb": options.workspace_gb,
            "device": device_name(),
            "source_export": str(Path(options.onnx).resolve()),
            **facts,
        },
    )
    return Sidecar.from_dict(data)


def build_trt(options: TrtBuildOptions, report: Report = print, warn: Report = to_stderr) -> Sidecar:
    """Build the engine into `options.out` (written whole or not at all); returns its sidecar.

    Raises ValueError / FileNotFoundError on an unusable export or profile (before TensorRT is touched),
    StackUnavailable without TensorRT or a usable GPU, BuildFailed when TensorRT fails or the engine
    does not verify (nothing written), OSError when writing fails.
    """
    plan = plan_build(options, report)
    from export.trt.runtime import TRTRunner
    from train.common.atomic_dir import atomic_directory

    onnx_dir, out = Path(options.onnx), Path(options.out)
    with atomic_directory(out) as tmp:
        with tempfile.TemporaryDirectory() as work:
            engine, facts = build_engine(options, plan, Path(work), report, warn)
        facts["position_limit"] = plan.limit
        (tmp / ENGINE_FILE).write_bytes(engine)
        for name in TOKENIZER_FILES:
            shutil.copyfile(onnx_dir / name, tmp / name)
        built = engine_sidecar(options, plan, facts)
        built.save(tmp)
        runner_ = TRTRunner(tmp)
        try:
            assert built.trt is not None  # engine_sidecar always sets it
            built.trt["io_dtypes"] = runner_.io_dtypes()  # Triton's config needs the engine's I/O types
            if options.verify:
                built.verification = verify_engine(runner_, plan, report)
        finally:
            runner_.close()
        built.save(tmp)
        if not built.verification["passed"] and options.verify:
            raise BuildFailed("the engine does not reproduce onnxruntime within the tolerance")
    report(f"wrote {out}/: {ENGINE_FILE}, {SIDECAR_FILE}, spiece.model, tokenizer_config.json")
    return built
