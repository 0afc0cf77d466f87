"""Export a QA checkpoint to ONNX, verify it against PyTorch, optimise it, optionally reduce its precision.

The pipeline behind ``python -m export.onnx`` (`export.onnx` is its command line), callable without argparse:
``export_onnx(OnnxExportOptions(checkpoint=..., out=...), report=print)``. Progress lines and warnings go
to callbacks, so a caller chooses where they land. Intermediate files live in a temporary sibling of
`out` that is renamed into place at the end, so a failed export never leaves a half-written directory.

1. `torch.onnx.export` of :class:`train.model.inference.QAInference` with the TorchScript exporter
   (`dynamo=False`): 0.3 s per model against 12-30 s for the dynamo exporter here, and after constant
   folding both give the same MatMul graph and latency within noise (the dynamo graph has no squeeze-`If`s,
   which we fold instead).
   Dynamic `batch`/`sequence` axes, int64 inputs, traced at a prime length no model size collides with.
2. Fold the squeeze-`If`s, constant-fold with ORT_ENABLE_BASIC (standard ONNX ops only: the "portable"
   graph for TensorRT and other runtimes) and check it: no EyeLike/OneHot/Einsum, no control flow, no
   shape constant specialised to the trace length (`export.onnx.graph`).
3. Verify onnxruntime (CPU EP, explicit threads) against PyTorch fp32 at three shapes, one longer than the
   trace and with batch > 1, on realistic `P <sep> Q <sep> <cls>` windows plus random-ids rows
   (`export.onnx.verify`); :class:`VerificationFailed` above the tolerance (1e-4 x max(1, the output's largest
   |value|): trained logits reach tens and float32 rounding grows with them).
4. fp32: optimise offline at ORT_ENABLE_EXTENDED (`export.onnx.optimize` says why not ENABLE_ALL) and ship it as
   `model.onnx` only if it verifies too; the portable graph stays beside it as `model.portable.onnx`.
   fp16 / int8 (`export.onnx.precision`: position tables computed in fp32, stored in fp16; int8 leaves the QA heads in float unless
   `quantize_heads`): convert the verified fp32 graph and verify it with a tolerance relative to each
   output's magnitude; `agreement_data` decodes SQuAD questions with it and with
   PyTorch fp32 and reports how often the answers are identical.
5. Write `model.onnx`, the tokenizer and `export.json` (`export.runtime.sidecar`).

Error messages name the command-line flags (``--out``, ``--threads``): the command line is the main user.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import onnx
import onnxruntime
import torch

from export.onnx.agreement import agreement
from export.onnx.graph import check_graph, nonstandard_ops, op_counts, trace_length_for
from export.onnx.optimize import measure_latency, optimize_offline
from export.onnx.precision import quantize_int8, to_fp16
from export.onnx.torch_export import export_graph, load_qa_checkpoint, torch_runner, weights_file
from export.onnx.verify import DEFAULT_SHAPES, DEFAULT_TOLERANCE, Comparison, compare, run_all, sample_batches
from export.runtime.providers import CPU, GPU_PROVIDERS, INT8_CPU_ONLY, canonical_provider
from export.runtime.sessions import default_threads, runner, session
from export.runtime.sidecar import PRECISIONS, SIDECAR_FILE, Sidecar, settings_from_metadata
from train.common.atomic_dir import atomic_directory
from train.common.digests import sha256_file
from train.model import HEADS, XLNetForQuestionAnswering
from train.model.inference import QAInference
from train.squad.answerability import Answerability
from train.squad.answerability import from_metadata as answerability_from_metadata

PROG = "python -m export.onnx"  # the command that runs this pipeline; its first progress line names it
MODEL_FILE = "model.onnx"
PORTABLE_FILE = "model.portable.onnx"
REFERENCE = "PyTorch QAInference fp32"

Report = Callable[[str], None]


class VerificationFailed(RuntimeError):
    """The exported graph does not reproduce PyTorch within the tolerance (nothing is written)."""


def _ignore(line: str) -> None:
    """The default progress callback: a library caller asked for no output."""


def _warn(line: str) -> None:
    """The default warning callback: a Python warning, which a library caller sees unless filtered."""
    warnings.warn(line, stacklevel=2)


@dataclass(frozen=True)
class OnnxExportOptions:
    """What to export and how; checked on construction, so bad values fail before any work.

    Defaults are the command line's. `threads` None: $OMP_NUM_THREADS or the cores. `tolerance` None: the
    default of `precision` (fp32 1e-4, fp16 5e-2, int8 0.5). `agreement_data` is kept as given: the
    agreement report records the path as written.
    """

    checkpoint: Path
    out: Path
    opset: int = 17
    precision: str = "fp32"
    head: str | None = None
    tokenizer: str | os.PathLike[str] | None = None
    verify: bool = True
    optimize: bool = True
    per_channel: bool = False
    quantize_heads: bool = False
    tolerance: float | None = None
    threads: int | None = None
    agreement_data: str | os.PathLike[str] | None = None
    agreement_max: int = 0
    benchmark: int = 0
    verify_providers: tuple[str, ...] = ()  # also verify on these onnxruntime providers (cuda, tensorrt)

    def __post_init__(self) -> None:
        names = tuple(dict.fromkeys(canonical_provider(p) for p in self.verify_providers))
        object.__setattr__(self, "verify_providers", names)
        if self.precision == "int8" and any(p in GPU_PROVIDERS for p in names):
            raise ValueError(f"--verify-provider: {INT8_CPU_ONLY}")
        if names and not self.verify:
            raise ValueError("--verify-provider needs verification (drop --no-verify)")
        if self.threads is not None and self.threads < 1:
            raise ValueError("--threads must be >= 1")
        if self.agreement_data and not Path(self.agreement_data).is_file():
            raise FileNotFoundError(f"--agreement-data {self.agreement_data}: no such file")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.head is not None and self.head not in HEADS:
            raise ValueError(f"--head must be one of {HEADS}, got {self.head!r}")


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the directory and its `export.json` (verification, optimisation, agreement)."""

    out: Path
    sidecar: Sidecar

    @property
    def model_path(self) -> Path:
        return self.out / self.sidecar.model_file

    @property
    def portable_path(self) -> Path | None:
        """The standard-ops graph for TensorRT and other runtimes (None for int8)."""
        name = self.sidecar.portable_model_file
        return self.out / name if name else None

    @property
    def verification(self) -> dict[str, Any]:
        """Per-output max |diff| vs PyTorch, tolerance, shapes; ``passed`` None when verification was off."""
        return self.sidecar.verification


def check_out_dir(out: Path, checkpoint: Path) -> None:
    """Fail before any work if `out` cannot become an export directory."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    if out.exists() and checkpoint.exists() and out.resolve() == checkpoint.resolve():
        raise ValueError(f"--out {out}: is the checkpoint directory")
    if out.is_dir() and any(out.iterdir()) and not (out / SIDECAR_FILE).exists():
        raise ValueError(f"--out {out}: not empty and not an export directory; refusing to replace it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        Path(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=out.parent)).rmdir()
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


class _Export:
    """One export run: builds the files in `tmp` and returns the sidecar fields it measured."""

    def __init__(
        self,
        options: OnnxExportOptions,
        tmp: Path,
        module: QAInference,
        tokenizer: Any,
        settings: dict[str, Any],
        report: Report,
        warn: Report,
        answerability: Answerability | None = None,
    ) -> None:
        self.options = options
        self.tmp = tmp
        self.module = module
        self.tokenizer = tokenizer
        self.settings = settings
        self.answerability = answerability
        self.report = report
        self.warn = warn
        self.names = list(module.names)
        self.config = module.model.config
        self.threads = options.threads or default_threads()
        self.work = tmp / ".work"
        self.work.mkdir()
        self.batches = sample_batches(tokenizer, DEFAULT_SHAPES, self.config.vocab_size)
        self.reference = run_all(torch_runner(module), self.batches) if options.verify else []
        self.record: dict[str, Any] = {}
        self.raw = self.work / "raw.onnx"
        self.fp32_result: Comparison | None = None

    def graph(self) -> Path:
        """Export, fold, constant-fold and check; returns the verified portable fp32 graph."""
        c = self.config
        dims = {c.d_model, c.n_head, c.d_head, c.d_inner, c.vocab_size, 2 * c.d_model}
        dims |= {c.start_n_top, c.end_n_top, c.start_n_top * c.end_n_top, 64, 128, 256, 384, 512}
        trace_len = trace_length_for(dims)
        trace = sample_batches(self.tokenizer, [(2, trace_len)], c.vocab_size, seed=1)[0]
        portable = self.work / "portable.onnx"
        self.record["exporter"] = export_graph(self.module, self.raw, self.options.opset, trace)
        optimize_offline(self.raw, portable, level="basic", threads=self.threads)
        model = onnx.load(str(portable))
        if nonstandard_ops(model):
            raise RuntimeError(f"ORT_ENABLE_BASIC introduced contrib ops {nonstandard_ops(model)}")
        check_graph(model, trace_len)
        self.report(
            f"exported: {len(model.graph.node)} nodes (folded {self.record['exporter']['folded_ifs']} squeeze-If), "
            f"no EyeLike/OneHot/Einsum/control flow/trace-length constants; traced at [2, {trace_len}]"
        )
        self.fp32_result = self.check("fp32 graph (onnxruntime) vs PyTorch", portable, "fp32", fatal=True)
        return portable

    def check(self, label: str, path: Path, precision: str, fatal: bool) -> Comparison | None:
        """Verify `path` against PyTorch fp32 and report per output."""
        if not self.options.verify:
            return None
        # `tolerance` is for the graph of the requested precision; the fp32 graph it comes from keeps 1e-4
        tol = self.options.tolerance
        if tol is None or precision != self.options.precision:
            tol = DEFAULT_TOLERANCE[precision]
        got = run_all(runner(session(path, threads=self.threads), self.names), self.batches)
        exact = precision == "fp32"
        # Relative to each output's largest |value| (floor 1): a trained model's logits reach tens, and
        # float32 rounding grows with them; random tiny models keep the plain 1e-4.
        result = compare(self.names, self.reference, got, tol, exact_indices=exact, relative=True)
        shapes = [list(b["input_ids"].shape) for b in self.batches]
        self.report(f"verify {label} at shapes {shapes} (relative tolerance {tol:g}):")
        for line in result.lines():
            self.report(line)
        self.report(f"  -> {'passed' if result.passed else 'FAILED: ' + '; '.join(result.problems)}")
        if fatal and not result.passed:
            raise VerificationFailed(f"{label}: " + "; ".join(result.problems))
        return result

    def on_providers(self, final: Path, portable: Path | None) -> dict[str, Any]:
        """Verify the graph each provider in ``verify_providers`` would serve (GPU ones: the portable
        graph) on that provider. A session that falls back to another provider is a failure naming the
        cause, not a pass on the CPU; GPU matmuls (TF32) get the fp32 tolerance x 10."""
        from export.runtime.probe import Probe, fallback_problem, preload_gpu_libraries

        results: dict[str, Any] = {}
        for provider in self.options.verify_providers:
            gpu = provider in GPU_PROVIDERS
            path = (portable or final) if gpu else final
            preload_gpu_libraries([provider])
            entries = [provider, CPU] if provider != CPU else [CPU]
            sess, active, error = None, [CPU], None  # a provider this wheel lacks: onnxruntime uses the CPU
            if provider in onnxruntime.get_available_providers():
                try:
                    sess = session(path, threads=self.threads, providers=entries)
                    active = list(sess.get_providers())
                except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types; the message is the fact
                    active, error = [], f"{type(exc).__name__}: {exc}"
            problem = fallback_problem(Probe([provider], active=active, error=error))
            if problem or sess is None:
                raise VerificationFailed(f"--verify-provider {provider}: {problem}")
            tol = DEFAULT_TOLERANCE[self.options.precision] * (
                10 if gpu and self.options.precision == "fp32" else 1
            )
            got = run_all(runner(sess, self.names), self.batches)
            result = compare(self.names, self.reference, got, tol, exact_indices=False, relative=True)
            self.report(f"verify {path.name} on {provider} (relative tolerance {tol:g}):")
            for line in result.lines():
                self.report(line)
            self.report(f"  -> {'passed' if result.passed else 'FAILED: ' + '; '.join(result.problems)}")
            if not result.passed:
                raise VerificationFailed(f"{provider}: " + "; ".join(result.problems))
            served = PORTABLE_FILE if path == portable and portable != final else MODEL_FILE
            results[provider] = {"graph": served, **verification_record(result, self.batches)}
        return results

    def fp32(self, portable: Path) -> tuple[Path, Comparison | None, str]:
        if not self.options.optimize:
            return portable, self.fp32_result, MODEL_FILE
        optimized = self.work / "optimized.onnx"
        info = self.record["optimization"] = optimize_offline(portable, optimized, threads=self.threads)
        self.report(
            f"optimised offline ({info['level']}): {info['nodes_before']} -> {info['nodes_after']} nodes, "
            f"new ops {info['fused_ops'] or 'none'}"
        )
        result = self.check("optimised graph vs PyTorch", optimized, "fp32", fatal=False)
        if result is None or result.passed:
            return optimized, result, PORTABLE_FILE
        self.warn("WARNING: the optimised graph does not verify; model.onnx is the unoptimised one")
        info["used"] = False
        return portable, self.fp32_result, MODEL_FILE

    def fp16(self, portable: Path) -> tuple[Path, Comparison | None, str]:
        path = self.work / "fp16.onnx"
        onnx.save(to_fp16(onnx.load(str(portable))), str(path))
        self.report(
            "fp16: float16 weights and compute (position tables computed in float32, stored in float16); "
            "float32 TopK; int64 in, float32 out"
        )
        if self.options.optimize:
            self.report(
                "fp16: no offline optimisation (onnxruntime optimises it online for the GPU provider that runs it)"
            )
        return path, self.check("fp16 graph vs PyTorch fp32", path, "fp16", fatal=True), MODEL_FILE

    def int8(self, portable: Path) -> tuple[Path, Comparison | None, None]:
        path = self.work / "int8.onnx"
        q = self.record["quantization"] = quantize_int8(
            portable, path, per_channel=self.options.per_channel, heads=self.options.quantize_heads
        )
        kept = f"; kept float: {len(q['excluded'])} ({', '.join(q['excluded'])})" if q["excluded"] else ""
        self.report(
            f"int8: quantized {q['quantized']} of {q['matmuls_with_constant_weight']} MatMul/Gemm with constant "
            f"weights ({q['matmuls']} in all, the others multiply two activations){kept}"
        )
        if self.options.optimize:
            optimized = self.work / "int8-optimized.onnx"
            self.record["optimization"] = optimize_offline(path, optimized, threads=self.threads)
            path = optimized
        return path, self.check("int8 graph vs PyTorch fp32", path, "int8", fatal=True), None

    def agreement(self, final: Path, data: str | os.PathLike[str]) -> None:
        rep = agreement(
            str(data),
            self.tokenizer,
            self.module.head,
            self.names,
            torch_runner(self.module),
            runner(session(final, threads=self.threads), self.names),
            self.settings,
            max_questions=self.options.agreement_max or None,
            answerability=self.answerability,
        )
        rep["reference"] = REFERENCE
        self.record["agreement"] = rep
        diffs = ", ".join(f"{k} {v:.3g}" for k, v in rep["max_abs_diff"].items())
        index = ", ".join(f"{k} {v:.4f}" for k, v in rep["fraction_equal"].items())
        self.report(
            f"agreement with PyTorch fp32 on {rep['questions']} questions ({rep['features']} windows): identical "
            f"answers {rep['identical_answers']:.4f}, identical best span {rep['identical_best_span']:.4f}, "
            f"same no-answer decision {rep['identical_no_answer_decision']:.4f}; max |diff| {diffs}"
            + (f"; index outputs equal {index}" if index else "")
        )
        self.report(
            f"best spans: {rep['best_span_changes']} changed, {rep['best_span_changes_at_near_ties']} of them where "
            f"fp32's top two spans are within {rep['near_tie']} of each other; where fp32's lead is larger "
            f"({rep['clear_best_span_questions']} questions) identical {rep['identical_clear_best_span']:.4f}"
        )

    def benchmark(self, final: Path) -> None:
        runs, t = self.options.benchmark, int(self.settings["max_seq_len"])
        feeds = sample_batches(self.tokenizer, [(1, t)], self.config.vocab_size)[0]
        cases = {
            "exported_no_optimisation": (self.raw, "disable"),
            "exported_online_all": (self.raw, "all"),
            "model_offline_only": (final, "disable"),
            "model_online_all": (final, "all"),
        }
        latency = {
            k: measure_latency(p, feeds, runs=runs, level=lv, threads=self.threads)
            for k, (p, lv) in cases.items()
        }
        self.record.setdefault("optimization", {})["latency"] = latency
        self.report(f"latency at batch 1 x {t}, {self.threads} thread(s), {runs} runs:")
        for name, m in latency.items():
            self.report(
                f"  {name:26s} median {m['median_ms']:8.2f} ms  p90 {m['p90_ms']:8.2f} ms  load {m['load_s']:.2f} s"
            )

    def build(self) -> dict[str, Any]:
        portable = self.graph()
        step = {"fp32": self.fp32, "fp16": self.fp16, "int8": self.int8}[self.options.precision]
        final, result, portable_name = step(portable)
        if result is not None:
            self.record["verification"] = verification_record(result, self.batches)
            if result is not self.fp32_result and self.fp32_result is not None:
                self.record["verification"]["fp32_graph"] = verification_record(
                    self.fp32_result, self.batches
                )
        else:
            self.record["verification"] = {"passed": None, "skipped": "--no-verify"}
        if self.options.verify_providers:  # GPU providers serve the portable graph (int8 has none: refused)
            gpu_path = portable if portable_name == PORTABLE_FILE else final
            self.record["verification"]["providers"] = self.on_providers(final, gpu_path)
        if self.options.agreement_data:
            self.agreement(final, self.options.agreement_data)
        if self.options.benchmark:
            self.benchmark(final)
        shutil.copyfile(final, self.tmp / MODEL_FILE)
        if portable_name == PORTABLE_FILE:
            shutil.copyfile(portable, self.tmp / PORTABLE_FILE)
        self.record["portable_model_file"] = portable_name
        shutil.rmtree(self.work)
        self.report(f"{MODEL_FILE} ops: {op_counts(onnx.load(str(self.tmp / MODEL_FILE)))}")
        return self.record


def verification_record(result: Comparison, batches) -> dict[str, Any]:
    record: dict[str, Any] = {
        "shapes": [list(b["input_ids"].shape) for b in batches],
        "max_abs_diff": result.max_abs_diff,
        "fraction_equal": result.fraction_equal,
        "tolerance": result.tolerance,
        "passed": result.passed,
        "reference": REFERENCE,
        "runtime": f"onnxruntime {onnxruntime.__version__} CPUExecutionProvider",
    }
    if result.relative:
        record["tolerance_is_relative_to"] = result.scale
    return record


def export_onnx(options: OnnxExportOptions, report: Report = _ignore, warn: Report = _warn) -> ExportResult:
    """Run the pipeline into `options.out`; progress lines go to `report`, warnings to `warn`.

    Raises VerificationFailed (nothing written), ValueError / FileNotFoundError on unusable input
    (before any export work), OSError when writing fails.
    """
    out, ckpt_path = options.out, options.checkpoint
    check_out_dir(out, ckpt_path)
    loaded = load_qa_checkpoint(ckpt_path, options.head, warn)
    tokenizer = loaded.tokenizer
    if options.tokenizer:
        from train.tokenizer import XLNetTokenizer

        tokenizer = XLNetTokenizer.from_dir(options.tokenizer)
    if tokenizer is None:
        raise ValueError(f"--checkpoint {ckpt_path}: has no spiece.model; pass --tokenizer DIR")
    config = loaded.config
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} pieces but the model only {config.vocab_size}"
        )
    module = QAInference(cast(XLNetForQuestionAnswering, loaded.model)).eval()  # a qa:<head> checkpoint
    settings: dict[str, Any] = settings_from_metadata(loaded.metadata)
    report(f"{PROG}: {ckpt_path} ({loaded.kind}, d_model {config.d_model}, {config.n_layer} layers) -> {out}")
    with atomic_directory(out) as tmp:
        decision = answerability_from_metadata(loaded.metadata)  # validated before any work
        record = _Export(options, tmp, module, tokenizer, settings, report, warn, decision).build()
        exporter = {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "method": "torch.onnx.export (TorchScript, dynamo=False)",
            **record.pop("exporter"),
        }
        weights = weights_file(ckpt_path)
        sidecar = Sidecar(
            backend="onnx",
            model_file=MODEL_FILE,
            head=module.head,
            precision=options.precision,
            d_model=config.d_model,
            n_layer=config.n_layer,
            vocab_size=config.vocab_size,
            outputs=list(module.names),
            opset=options.opset,
            start_n_top=config.start_n_top,
            end_n_top=config.end_n_top,
            source_checkpoint=str(ckpt_path.resolve()),
            source_checkpoint_sha256=sha256_file(weights) if weights else "",
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            exporter=exporter,
            answerability=loaded.metadata.get("answerability"),
            **settings,
            **record,
        )
        if loaded.metadata.get("untrained_head"):
            sidecar.extra["untrained_head"] = True
        tokenizer.save(tmp)
        sidecar.save(tmp)
    report(f"wrote {out}/: {MODEL_FILE}, {SIDECAR_FILE}, spiece.model, tokenizer_config.json")
    return ExportResult(out, sidecar)
