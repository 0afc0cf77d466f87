"""The state one ONNX export run shares between its steps and its optional measurements."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from export.onnx.options import OnnxExportOptions, Report
from export.onnx.torch_export import torch_runner
from export.onnx.verify import DEFAULT_SHAPES, Comparison, run_all, sample_batches
from qa_core.contract import ModelSettings
from qa_core.runtime.sessions import default_threads
from qa_core.squad.answerability import Answerability
from train.model.inference import QAInference


class ExportContext:
    """What one export run works from and writes into: its options, the traced module and tokenizer,
    the sample batches with PyTorch's reference outputs, the report callbacks and the sidecar record.
    The steps (`export.onnx.steps`) and the optional measurements (`export.onnx.measurements`) both
    take it, so neither imports the other's class."""

    def __init__(
        self,
        options: OnnxExportOptions,
        tmp: Path,
        module: QAInference,
        tokenizer: Any,
        settings: ModelSettings,
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
        self.fp32_result: Comparison | None = None  # the portable graph's verification
        self.cpu_result: Comparison | None = None  # the fused-attention CPU graph's, when there is one
        self.trace_len = 0  # the export's trace shape [2, trace_len] (`ExportSteps.graph`)
        self.trace: dict[str, Any] = {}
