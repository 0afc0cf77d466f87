"""Export a QA checkpoint to ONNX, verify it against PyTorch, optimise it, optionally reduce its precision.

    python -m export.onnx --checkpoint runs/ft --out exports/onnx [--opset 17] [--precision fp32|fp16|int8]
        [--head H] [--no-verify] [--optimize/--no-optimize] [--agreement-data dev.json --agreement-max N]

Pipeline (intermediate files live in a temporary sibling of `--out` that is renamed into place at the end,
so a failed export never leaves a half-written directory):

1. `torch.onnx.export` of :class:`train.model.inference.QAInference` with the TorchScript exporter
   (`dynamo=False`): 0.3 s per model against 12-30 s for the dynamo exporter here, and after constant
   folding both give the same MatMul graph and latency within noise (the dynamo graph has no squeeze-`If`s,
   which we fold instead).
   Dynamic `batch`/`sequence` axes, int64 inputs, traced at a prime length no model size collides with.
2. Fold the squeeze-`If`s, constant-fold with ORT_ENABLE_BASIC (standard ONNX ops only: the "portable"
   graph for TensorRT and other runtimes) and check it: no EyeLike/OneHot/Einsum, no control flow, no
   shape constant specialised to the trace length (`export.graph`).
3. Verify onnxruntime (CPU EP, explicit threads) against PyTorch fp32 at three shapes, one longer than the
   trace and with batch > 1, on realistic `P <sep> Q <sep> <cls>` windows plus random-ids rows
   (`export.verify`); exit code 1 above the tolerance (1e-4 x max(1, the output's largest |value|): trained logits reach
   tens and float32 rounding grows with them).
4. fp32: optimise offline at ORT_ENABLE_EXTENDED (`export.optimize` says why not ENABLE_ALL) and ship it as
   `model.onnx` only if it verifies too; the portable graph stays beside it as `model.portable.onnx`.
   fp16 / int8 (`export.precision`: fp32 position table in fp16; int8 leaves the QA heads in float unless
   --quantize-heads): convert the verified fp32 graph and verify it with a tolerance relative to each
   output's magnitude; `--agreement-data` decodes SQuAD questions with it and with
   PyTorch fp32 and reports how often the answers are identical.
5. Write `model.onnx`, the tokenizer and `export.json` (`export.sidecar`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import onnx
import onnxruntime
import torch

from export.agreement import agreement
from export.graph import check_graph, nonstandard_ops, op_counts, trace_length_for
from export.optimize import measure_latency, optimize_offline
from export.precision import quantize_int8, to_fp16
from export.sessions import default_threads, runner, session
from export.sidecar import PRECISIONS, SIDECAR_FILE, Sidecar, settings_from_metadata, sha256_file
from export.torch_export import export_graph, load_qa_checkpoint, torch_runner, weights_file
from export.verify import DEFAULT_SHAPES, DEFAULT_TOLERANCE, Comparison, compare, run_all, sample_batches
from train.atomic_dir import atomic_directory
from train.cli import Parser, run
from train.model import HEADS, XLNetForQuestionAnswering
from train.model.inference import QAInference

PROG = "python -m export.onnx"
MODEL_FILE = "model.onnx"
PORTABLE_FILE = "model.portable.onnx"
REFERENCE = "PyTorch QAInference fp32"


class VerificationFailed(RuntimeError):
    """The exported graph does not reproduce PyTorch within the tolerance (exit code 1)."""


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Export a QA checkpoint (ours or HuggingFace XLNet) to ONNX.")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (ours or HuggingFace XLNet)")
    p.add_argument("--out", required=True, help="export directory to create (an existing export is replaced)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument(
        "--head", choices=HEADS, help="QA head; LM/base checkpoints need it and get an UNTRAINED head"
    )
    p.add_argument("--tokenizer", help="tokenizer directory, when the checkpoint has no spiece.model")
    p.add_argument(
        "--no-verify", dest="verify", action="store_false", help="skip the onnxruntime-vs-PyTorch check"
    )
    p.add_argument(
        "--optimize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="offline onnxruntime optimisation (fp32, int8), kept only if it verifies",
    )
    p.add_argument("--per-channel", action="store_true", help="int8: per-channel weight scales")
    p.add_argument("--quantize-heads", action="store_true", help="int8: quantize the QA heads' MatMuls too")
    p.add_argument(
        "--tolerance",
        type=float,
        help="max |diff| vs PyTorch relative to max(1, max |output|) (default fp32 1e-4; fp16 5e-2, int8 0.5)",
    )
    p.add_argument(
        "--threads", type=int, help="onnxruntime intra-op threads (default: $OMP_NUM_THREADS or cores)"
    )
    p.add_argument("--agreement-data", help="SQuAD json: compare decoded answers with PyTorch fp32")
    p.add_argument(
        "--agreement-max", type=int, default=0, help="questions used from --agreement-data (0: all)"
    )
    p.add_argument(
        "--benchmark", type=int, default=0, metavar="RUNS", help="time RUNS calls (batch 1 x max_seq_len)"
    )
    return p


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

    def __init__(self, args: argparse.Namespace, tmp: Path, module: QAInference, tokenizer, settings) -> None:
        self.args = args
        self.tmp = tmp
        self.module = module
        self.tokenizer = tokenizer
        self.settings = settings
        self.names = list(module.names)
        self.config = module.model.config
        self.threads = args.threads or default_threads()
        self.work = tmp / ".work"
        self.work.mkdir()
        self.batches = sample_batches(tokenizer, DEFAULT_SHAPES, self.config.vocab_size)
        self.reference = run_all(torch_runner(module), self.batches) if args.verify else []
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
        self.record["exporter"] = export_graph(self.module, self.raw, self.args.opset, trace)
        optimize_offline(self.raw, portable, level="basic", threads=self.threads)
        model = onnx.load(str(portable))
        if nonstandard_ops(model):
            raise RuntimeError(f"ORT_ENABLE_BASIC introduced contrib ops {nonstandard_ops(model)}")
        check_graph(model, trace_len)
        print(
            f"exported: {len(model.graph.node)} nodes (folded {self.record['exporter']['folded_ifs']} squeeze-If), "
            f"no EyeLike/OneHot/Einsum/control flow/trace-length constants; traced at [2, {trace_len}]"
        )
        self.fp32_result = self.check("fp32 graph (onnxruntime) vs PyTorch", portable, "fp32", fatal=True)
        return portable

    def check(self, label: str, path: Path, precision: str, fatal: bool) -> Comparison | None:
        """Verify `path` against PyTorch fp32 and print the per-output report."""
        if not self.args.verify:
            return None
        # --tolerance is for the graph of the requested precision; the fp32 graph it comes from keeps 1e-4
        own = self.args.tolerance is not None and precision == self.args.precision
        tol = self.args.tolerance if own else DEFAULT_TOLERANCE[precision]
        got = run_all(runner(session(path, threads=self.threads), self.names), self.batches)
        exact = precision == "fp32"
        # Relative to each output's largest |value| (floor 1): a trained model's logits reach tens, and
        # float32 rounding grows with them; random tiny models keep the plain 1e-4.
        result = compare(self.names, self.reference, got, tol, exact_indices=exact, relative=True)
        shapes = [list(b["input_ids"].shape) for b in self.batches]
        print(f"verify {label} at shapes {shapes} (relative tolerance {tol:g}):")
        print("\n".join(result.lines()))
        print(f"  -> {'passed' if result.passed else 'FAILED: ' + '; '.join(result.problems)}")
        if fatal and not result.passed:
            raise VerificationFailed(f"{label}: " + "; ".join(result.problems))
        return result

    def fp32(self, portable: Path) -> tuple[Path, Comparison | None, str]:
        if not self.args.optimize:
            return portable, self.fp32_result, MODEL_FILE
        optimized = self.work / "optimized.onnx"
        info = self.record["optimization"] = optimize_offline(portable, optimized, threads=self.threads)
        print(
            f"optimised offline ({info['level']}): {info['nodes_before']} -> {info['nodes_after']} nodes, "
            f"new ops {info['fused_ops'] or 'none'}"
        )
        result = self.check("optimised graph vs PyTorch", optimized, "fp32", fatal=False)
        if result is None or result.passed:
            return optimized, result, PORTABLE_FILE
        print(
            "WARNING: the optimised graph does not verify; model.onnx is the unoptimised one", file=sys.stderr
        )
        info["used"] = False
        return portable, self.fp32_result, MODEL_FILE

    def fp16(self, portable: Path) -> tuple[Path, Comparison | None, str]:
        path = self.work / "fp16.onnx"
        onnx.save(to_fp16(onnx.load(str(portable))), str(path))
        print("fp16: float16 weights and compute; float32 position table and TopK; int64 in, float32 out")
        if self.args.optimize:
            print(
                "fp16: no offline optimisation (onnxruntime optimises it online for the GPU provider that runs it)"
            )
        return path, self.check("fp16 graph vs PyTorch fp32", path, "fp16", fatal=True), MODEL_FILE

    def int8(self, portable: Path) -> tuple[Path, Comparison | None, None]:
        path = self.work / "int8.onnx"
        q = self.record["quantization"] = quantize_int8(
            portable, path, per_channel=self.args.per_channel, heads=self.args.quantize_heads
        )
        kept = f"; kept float: {len(q['excluded'])} ({', '.join(q['excluded'])})" if q["excluded"] else ""
        print(
            f"int8: quantized {q['quantized']} of {q['matmuls_with_constant_weight']} MatMul/Gemm with constant "
            f"weights ({q['matmuls']} in all, the others multiply two activations){kept}"
        )
        if self.args.optimize:
            optimized = self.work / "int8-optimized.onnx"
            self.record["optimization"] = optimize_offline(path, optimized, threads=self.threads)
            path = optimized
        return path, self.check("int8 graph vs PyTorch fp32", path, "int8", fatal=True), None

    def agreement(self, final: Path) -> None:
        rep = agreement(
            self.args.agreement_data,
            self.tokenizer,
            self.module.head,
            self.names,
            torch_runner(self.module),
            runner(session(final, threads=self.threads), self.names),
            self.settings,
            max_questions=self.args.agreement_max or None,
        )
        rep["reference"] = REFERENCE
        self.record["agreement"] = rep
        diffs = ", ".join(f"{k} {v:.3g}" for k, v in rep["max_abs_diff"].items())
        index = ", ".join(f"{k} {v:.4f}" for k, v in rep["fraction_equal"].items())
        print(
            f"agreement with PyTorch fp32 on {rep['questions']} questions ({rep['features']} windows): identical "
            f"answers {rep['identical_answers']:.4f}, identical best span {rep['identical_best_span']:.4f}, "
            f"same no-answer decision {rep['identical_no_answer_decision']:.4f}; max |diff| {diffs}"
            + (f"; index outputs equal {index}" if index else "")
        )
        print(
            f"best spans: {rep['best_span_changes']} changed, {rep['best_span_changes_at_near_ties']} of them where "
            f"fp32's top two spans are within {rep['near_tie']} of each other; where fp32's lead is larger "
            f"({rep['clear_best_span_questions']} questions) identical {rep['identical_clear_best_span']:.4f}"
        )

    def benchmark(self, final: Path) -> None:
        runs, t = self.args.benchmark, int(self.settings["max_seq_len"])
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
        print(f"latency at batch 1 x {t}, {self.threads} thread(s), {runs} runs:")
        for name, m in latency.items():
            print(
                f"  {name:26s} median {m['median_ms']:8.2f} ms  p90 {m['p90_ms']:8.2f} ms  load {m['load_s']:.2f} s"
            )

    def build(self) -> dict[str, Any]:
        portable = self.graph()
        step = {"fp32": self.fp32, "fp16": self.fp16, "int8": self.int8}[self.args.precision]
        final, result, portable_name = step(portable)
        if result is not None:
            self.record["verification"] = verification_record(result, self.batches)
            if result is not self.fp32_result and self.fp32_result is not None:
                self.record["verification"]["fp32_graph"] = verification_record(
                    self.fp32_result, self.batches
                )
        else:
            self.record["verification"] = {"passed": None, "skipped": "--no-verify"}
        if self.args.agreement_data:
            self.agreement(final)
        if self.args.benchmark:
            self.benchmark(final)
        shutil.copyfile(final, self.tmp / MODEL_FILE)
        if portable_name == PORTABLE_FILE:
            shutil.copyfile(portable, self.tmp / PORTABLE_FILE)
        self.record["portable_model_file"] = portable_name
        shutil.rmtree(self.work)
        print(f"{MODEL_FILE} ops: {op_counts(onnx.load(str(self.tmp / MODEL_FILE)))}")
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


def export(args: argparse.Namespace) -> int:
    out, ckpt_path = Path(args.out), Path(args.checkpoint)
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be >= 1")
    if args.agreement_data and not Path(args.agreement_data).is_file():
        raise FileNotFoundError(f"--agreement-data {args.agreement_data}: no such file")
    check_out_dir(out, ckpt_path)
    loaded = load_qa_checkpoint(ckpt_path, args.head)
    tokenizer = loaded.tokenizer
    if args.tokenizer:
        from train.tokenizer import XLNetTokenizer

        tokenizer = XLNetTokenizer.from_dir(args.tokenizer)
    if tokenizer is None:
        raise ValueError(f"--checkpoint {ckpt_path}: has no spiece.model; pass --tokenizer DIR")
    config = loaded.config
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} pieces but the model only {config.vocab_size}"
        )
    module = QAInference(cast(XLNetForQuestionAnswering, loaded.model)).eval()  # a qa:<head> checkpoint
    settings: dict[str, Any] = settings_from_metadata(loaded.metadata)
    print(f"{PROG}: {ckpt_path} ({loaded.kind}, d_model {config.d_model}, {config.n_layer} layers) -> {out}")
    try:
        with atomic_directory(out) as tmp:
            record = _Export(args, tmp, module, tokenizer, settings).build()
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
                precision=args.precision,
                d_model=config.d_model,
                n_layer=config.n_layer,
                vocab_size=config.vocab_size,
                outputs=list(module.names),
                opset=args.opset,
                start_n_top=config.start_n_top,
                end_n_top=config.end_n_top,
                source_checkpoint=str(ckpt_path.resolve()),
                source_checkpoint_sha256=sha256_file(weights) if weights else "",
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                exporter=exporter,
                **settings,
                **record,
            )
            if loaded.metadata.get("untrained_head"):
                sidecar.extra["untrained_head"] = True
            tokenizer.save(tmp)
            sidecar.save(tmp)
    except VerificationFailed as exc:
        print(f"{PROG}: error: verification failed, nothing written: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}/: {MODEL_FILE}, {SIDECAR_FILE}, spiece.model, tokenizer_config.json")
    return 0


def _main(argv: Sequence[str] | None) -> int:
    return export(build_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: user errors -> one line and exit 2; a failed verification -> exit 1."""
    return run(_main, argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
