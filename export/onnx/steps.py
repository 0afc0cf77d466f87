"""The steps of one ONNX export (`export.onnx.exporter` describes them and why they are so): export and
check the portable fp32 graph, verify it against PyTorch, then the graph of the requested precision, the
optional measurements (`export.onnx.measurements`) and the files of the export directory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import onnx

from export.onnx.context import ExportContext
from export.onnx.graph import check_graph, nonstandard_ops, op_counts, trace_length_for
from export.onnx.measurements import (
    agreement_report,
    latency_report,
    verification_record,
    verify_on_providers,
)
from export.onnx.optimize import optimize_offline
from export.onnx.options import MODEL_FILE, PORTABLE_FILE, VerificationFailed
from export.onnx.precision import quantize_int8, to_fp16
from export.onnx.torch_export import export_graph
from export.onnx.verify import DEFAULT_TOLERANCE, Comparison, compare, run_all, sample_batches
from qa_core.runtime.sessions import runner, session
from train.model.contrib_attention import DOMAIN, OP_TYPE

CONTRIB_ATTENTION = f"{DOMAIN}.{OP_TYPE}"  # as `op_counts` and `nonstandard_ops` name it


class ExportSteps(ExportContext):
    """One export run: builds the files in `tmp` and returns the sidecar fields it measured."""

    def graph(self) -> Path:
        """Export, fold, constant-fold and check; returns the verified portable fp32 graph."""
        c = self.config
        dims = {c.d_model, c.n_head, c.d_head, c.d_inner, c.vocab_size, 2 * c.d_model}
        dims |= {c.start_n_top, c.end_n_top, c.start_n_top * c.end_n_top, 64, 128, 256, 384, 512}
        self.trace_len = trace_len = trace_length_for(dims)
        self.trace = sample_batches(self.tokenizer, [(2, trace_len)], c.vocab_size, seed=1)[0]
        portable = self.work / "portable.onnx"
        self.record["exporter"] = export_graph(self.module, self.raw, self.options.opset, self.trace)
        self.record["exporter"]["cpu_attention"] = "standard ops"
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

    def cpu_graph(self, portable: Path) -> Path:
        """The graph the CPU main graph is made from: the portable one, or with `fused_attention` a second
        export whose attention is onnxruntime's contrib operator, checked and verified as the first."""
        if not self.options.fused_attention:
            return portable
        raw, path = self.work / "raw-contrib.onnx", self.work / "contrib.onnx"
        export_graph(self.module, raw, self.options.opset, self.trace, contrib_attention=True)
        optimize_offline(raw, path, level="basic", threads=self.threads)
        model = onnx.load(str(path))
        if nonstandard_ops(model) != [CONTRIB_ATTENTION]:
            raise RuntimeError(f"the fused-attention graph has contrib ops {nonstandard_ops(model)}")
        check_graph(model, self.trace_len)
        self.record["exporter"]["cpu_attention"] = CONTRIB_ATTENTION
        self.report(f"exported the CPU graph on {CONTRIB_ATTENTION}: {len(model.graph.node)} nodes")
        self.cpu_result = self.check(
            "fused-attention graph (onnxruntime) vs PyTorch", path, "fp32", fatal=True
        )
        return path

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
        for line in result.summary(f"verify {label} at shapes {shapes} (relative tolerance {tol:g}):"):
            self.report(line)
        if fatal and not result.passed:
            raise VerificationFailed(f"{label}: " + "; ".join(result.problems))
        return result

    def fp32(self, portable: Path) -> tuple[Path, Comparison | None, str]:
        cpu = self.cpu_graph(portable)
        kept = PORTABLE_FILE if cpu != portable else MODEL_FILE  # the portable graph beside a CPU-only one
        if not self.options.optimize:
            return cpu, self.fp32_result if cpu == portable else self.cpu_result, kept
        optimized = self.work / "optimized.onnx"
        info = self.record["optimization"] = optimize_offline(cpu, optimized, threads=self.threads)
        self.report(
            f"optimised offline ({info['level']}): {info['nodes_before']} -> {info['nodes_after']} nodes, "
            f"new ops {info['fused_ops'] or 'none'}"
        )
        result = self.check("optimised graph vs PyTorch", optimized, "fp32", fatal=False)
        if result is None or result.passed:
            return optimized, result, PORTABLE_FILE
        self.warn("WARNING: the optimised graph does not verify; model.onnx is the unoptimised one")
        info["used"] = False
        return cpu, self.fp32_result if cpu == portable else self.cpu_result, kept

    def fp16(self, portable: Path) -> tuple[Path, Comparison | None, str]:
        if self.options.fused_attention:
            self.report(
                "fp16: standard ops (GPU providers and TensorRT serve it; --fused-attention is for the CPU)"
            )
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
            self.cpu_graph(portable),
            path,
            per_channel=self.options.per_channel,
            heads=self.options.quantize_heads,
            activations=self.options.int8_attention,
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
            self.record["verification"]["providers"] = verify_on_providers(self, final, gpu_path)
        if self.options.agreement_data:
            agreement_report(self, final, self.options.agreement_data)
        if self.options.benchmark:
            latency_report(self, final)
        shutil.copyfile(final, self.tmp / MODEL_FILE)
        if portable_name == PORTABLE_FILE:
            shutil.copyfile(portable, self.tmp / PORTABLE_FILE)
        self.record["portable_model_file"] = portable_name
        shutil.rmtree(self.work)
        self.report(f"{MODEL_FILE} ops: {op_counts(onnx.load(str(self.tmp / MODEL_FILE)))}")
        return self.record
