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
5. Write `model.onnx`, the tokenizer and `export.json` (`qa_core.runtime.sidecar`).

Error messages name the command-line flags (``--out``, ``--threads``): the command line is the main user.
The options and results are in `export.onnx.options`, the steps in `export.onnx.steps`, the optional
measurements (other providers, agreement, latency) in `export.onnx.measurements`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import cast

import onnx
import onnxruntime
import torch

from export.onnx.options import (
    MODEL_FILE,
    PORTABLE_FILE,
    PROG,
    ExportResult,
    OnnxExportOptions,
    Report,
    VerificationFailed,
    check_out_dir,
    ignore,
    warn_python,
)
from export.onnx.steps import ExportSteps
from export.onnx.torch_export import load_qa_checkpoint, weights_file
from qa_core.contract import ModelSettings
from qa_core.digests import sha256_file
from qa_core.runtime.sidecar import SIDECAR_FILE, ServingSettings, Sidecar
from qa_core.squad.answerability import from_metadata as answerability_from_metadata
from train.common.atomic_dir import atomic_directory
from train.model import XLNetForQuestionAnswering
from train.model.inference import QAInference

__all__ = [
    "MODEL_FILE",
    "PORTABLE_FILE",
    "PROG",
    "ExportResult",
    "OnnxExportOptions",
    "VerificationFailed",
    "check_out_dir",
    "export_onnx",
]


def export_onnx(
    options: OnnxExportOptions, report: Report = ignore, warn: Report = warn_python
) -> ExportResult:
    """Run the pipeline into `options.out`; progress lines go to `report`, warnings to `warn`.

    Raises VerificationFailed (nothing written), ValueError / FileNotFoundError on unusable input
    (before any export work), OSError when writing fails.
    """
    out, ckpt_path = options.out, options.checkpoint
    check_out_dir(out, ckpt_path)
    loaded = load_qa_checkpoint(ckpt_path, options.head, warn)
    tokenizer = loaded.tokenizer
    if options.tokenizer:
        from qa_core.tokenizer import XLNetTokenizer

        tokenizer = XLNetTokenizer.from_dir(options.tokenizer)
    if tokenizer is None:
        raise ValueError(f"--checkpoint {ckpt_path}: has no spiece.model; pass --tokenizer DIR")
    config = loaded.config
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} pieces but the model only {config.vocab_size}"
        )
    module = QAInference(cast(XLNetForQuestionAnswering, loaded.model)).eval()  # a qa:<head> checkpoint
    settings = ModelSettings.from_metadata(loaded.metadata)  # the model's own, defaults where it records none
    report(f"{PROG}: {ckpt_path} ({loaded.kind}, d_model {config.d_model}, {config.n_layer} layers) -> {out}")
    with atomic_directory(out) as tmp:
        decision = answerability_from_metadata(loaded.metadata)  # validated before any work
        record = ExportSteps(options, tmp, module, tokenizer, settings, report, warn, decision).build()
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
            serving=ServingSettings.of(settings, start_n_top=config.start_n_top, end_n_top=config.end_n_top),
            source_checkpoint=str(ckpt_path.resolve()),
            source_checkpoint_sha256=sha256_file(weights) if weights else "",
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            exporter=exporter,
            answerability=loaded.metadata.get("answerability"),
            **record,
        )
        if loaded.metadata.get("untrained_head"):
            sidecar.extra["untrained_head"] = True
        tokenizer.save(tmp)
        sidecar.save(tmp)
    report(f"wrote {out}/: {MODEL_FILE}, {SIDECAR_FILE}, spiece.model, tokenizer_config.json")
    return ExportResult(out, sidecar)
