"""What `export.onnx.exporter` takes and gives: :class:`OnnxExportOptions` (checked on construction),
:class:`ExportResult`, the file names of an export directory, the progress callbacks and
:class:`VerificationFailed`."""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qa_core.runtime.providers import GPU_PROVIDERS, INT8_CPU_ONLY, canonical_provider
from qa_core.runtime.sidecar import EXPORT_PRECISIONS, SIDECAR_FILE, Sidecar
from train.common.dataclass_flags import flag
from train.model import HEADS

PROG = "python -m export.onnx"  # the command that runs this pipeline; its first progress line names it
MODEL_FILE = "model.onnx"
PORTABLE_FILE = "model.portable.onnx"
REFERENCE = "PyTorch QAInference fp32"

Report = Callable[[str], None]


class VerificationFailed(RuntimeError):
    """The exported graph does not reproduce PyTorch within the tolerance (nothing is written)."""


def ignore(line: str) -> None:
    """The default progress callback: a library caller asked for no output."""


def warn_python(line: str) -> None:
    """The default warning callback: a Python warning, which a library caller sees unless filtered."""
    warnings.warn(line, stacklevel=2)


def provider_flag(text: str) -> str:
    """``cuda`` -> ``CUDAExecutionProvider``; argparse's one-line error for an unknown name."""
    try:
        return canonical_provider(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class OnnxExportOptions:
    """What to export and how; checked on construction, so bad values fail before any work.

    Each field is a flag of ``python -m export.onnx`` (:mod:`train.common.dataclass_flags`). `threads` None: $OMP_NUM_THREADS or the cores. `tolerance` None: the
    default of `precision` (fp32 1e-4, fp16 5e-2, int8 0.5). `agreement_data` is kept as given: the
    agreement report records the path as written.
    """

    checkpoint: Path = flag(help="checkpoint directory (ours or HuggingFace XLNet)")
    out: Path = flag(help="export directory to create (an existing export is replaced)")
    opset: int = flag(17, help="ONNX opset")
    precision: str = flag("fp32", choices=EXPORT_PRECISIONS)
    head: str | None = flag(
        None, choices=HEADS, help="QA head; LM/base checkpoints need it and get an UNTRAINED head"
    )
    tokenizer: str | os.PathLike[str] | None = flag(
        None, help="tokenizer directory, when the checkpoint has no spiece.model"
    )
    verify: bool = flag(True, help="check the graph on onnxruntime against PyTorch")
    optimize: bool = flag(
        True, help="offline onnxruntime optimisation (fp32, int8), kept only if it verifies"
    )
    per_channel: bool = flag(False, help="int8: per-channel weight scales")
    quantize_heads: bool = flag(False, help="int8: quantize the QA heads' MatMuls too")
    tolerance: float | None = flag(
        None,
        help="max |diff| vs PyTorch relative to max(1, max |output|) (default fp32 1e-4; fp16 5e-2, int8 0.5)",
    )
    threads: int | None = flag(None, help="onnxruntime intra-op threads (default: $OMP_NUM_THREADS or cores)")
    agreement_data: str | os.PathLike[str] | None = flag(
        None, help="SQuAD json: compare decoded answers with PyTorch fp32"
    )
    agreement_max: int = flag(0, help="questions used from --agreement-data (0: all)")
    benchmark: int = flag(0, metavar="RUNS", help="time RUNS calls (batch 1 x max_seq_len)")
    verify_providers: tuple[str, ...] = flag(
        (),
        name="--verify-provider",
        parse=provider_flag,
        repeat=True,
        metavar="PROVIDER",
        help="also verify on this onnxruntime provider (cuda, tensorrt, cpu; repeatable): the graph it would "
        "serve, on that provider; a session that falls back to another provider fails the export",
    )
    fused_attention: bool = flag(
        False,
        help="fp32/int8: the CPU graph (model.onnx) runs each layer's attention as onnxruntime's "
        "com.microsoft::MultiHeadAttention; the standard-ops graph stays beside it for other runtimes",
    )
    int8_attention: bool = flag(
        False,
        help="int8: also the attention products (two activations, each quantized per call), not only the "
        "MatMuls with constant weights (slower than float products on a 2-core AVX-512 EPYC: BENCHMARKS.md)",
    )

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
        if self.precision not in EXPORT_PRECISIONS:
            raise ValueError(f"--precision must be one of {EXPORT_PRECISIONS}, got {self.precision!r}")
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
