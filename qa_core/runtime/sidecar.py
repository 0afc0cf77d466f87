"""`export.json`: what an export directory holds and how to serve it (read by the server, written by exporters).

Torch-free on purpose (the ONNX/TensorRT server imports it without torch). An export directory holds the
model file (`model.onnx` or `model.engine`), the tokenizer (`spiece.model` + `tokenizer_config.json`) and
`export.json`, whose keys are the fields of :class:`Sidecar`. Loading validates everything a server
relies on and fails with one message naming the file and the problem, never a KeyError deep in serving.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from qa_core.contract import (
    END_N_TOP,
    INPUT_NAMES,
    OUTPUT_NAMES,
    START_N_TOP,
    ModelSettings,
    positive_int,
)
from qa_core.digests import sha256_file
from qa_core.runtime.backends import EXPORT_BACKENDS, TRT, canonical_backend
from qa_core.squad.answerability import Answerability, AnswerabilityError, from_metadata

FORMAT_VERSION = 1
SIDECAR_FILE = "export.json"
TOKENIZER_FILES = ("spiece.model", "tokenizer_config.json")
_HEX64 = re.compile(r"[0-9a-f]{64}")
EXPORT_PRECISIONS = ("fp32", "fp16", "int8")

# onnxruntime graph rewrites that make these graphs slower on the CPU execution provider, so every CPU
# session (export's offline optimisation, verification, benchmarks, the server) switches them off.
# SkipLayerNormFusion turns Add (+ bias Add) + LayerNormalization into com.microsoft.SkipLayerNormalization,
# whose CPU kernel took 1.8 ms per call against ~0.3 ms for the unfused Add + LayerNormalization
# (onnxruntime 1.32, xlnet-base shape at 1x384, ORT profile): 8% of the whole int8 model's latency.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def ort_disabled_optimizers(providers: Sequence[str]) -> list[str]:
    """The rewrites to switch off for a session whose first (preferred) provider is `providers[0]`."""
    return list(CPU_DISABLED_OPTIMIZERS) if providers and providers[0] == "CPUExecutionProvider" else []


class SidecarError(ValueError):
    """An export directory or its `export.json` is missing or invalid; the message says which and why."""


@dataclass(frozen=True, kw_only=True)
class ServingSettings(ModelSettings):
    """How a model is served: its :class:`ModelSettings` (windows, the longest answer, n-best, the
    no-answer threshold), declared there once, and the beam head's top-k, which the graph fixes.
    :class:`Sidecar` records them in ``export.json`` and the server's ``ModelSpec`` carries them, whether
    they came from an export or from a checkpoint's metadata."""

    start_n_top: int = START_N_TOP
    end_n_top: int = END_N_TOP

    @classmethod
    def of(
        cls, model: ModelSettings, *, start_n_top: int = START_N_TOP, end_n_top: int = END_N_TOP
    ) -> ServingSettings:
        """A model's settings served with the beam's top-k."""
        values = {f.name: getattr(model, f.name) for f in dataclasses.fields(ModelSettings)}
        return cls(**values, start_n_top=start_n_top, end_n_top=end_n_top)

    @property
    def model(self) -> ModelSettings:
        """The model's settings alone (without the beam's top-k)."""
        return ModelSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelSettings)})


@dataclass
class Sidecar:
    """The contents of `export.json` (format_version 1). Unknown keys are kept in `extra` and written back.

    The serving settings are one value, `serving`; `export.json` keeps their keys flat after `opset`,
    where it has always had them (`to_dict`, `from_dict`)."""

    backend: str
    model_file: str
    head: str
    precision: str
    d_model: int
    n_layer: int
    vocab_size: int
    outputs: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=lambda: list(INPUT_NAMES))
    opset: int | None = 17
    serving: ServingSettings = field(default_factory=ServingSettings)
    source_checkpoint: str = ""
    source_checkpoint_sha256: str = ""
    created: str = ""
    exporter: dict[str, Any] = field(default_factory=dict)
    verification: dict[str, Any] = field(default_factory=dict)
    trt: dict[str, Any] | None = None
    # Standard-ONNX-ops graph (no onnxruntime contrib ops) for TensorRT and other runtimes; None for int8.
    portable_model_file: str | None = None
    optimization: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None
    agreement: dict[str, Any] | None = None
    # The fitted answerability model (qa_core.squad.answerability), applied by every server backend and
    # by Triton clients; None: sigmoid(cls_logit) against no_answer_threshold.
    answerability: dict[str, Any] | None = None
    # sha256 of every file a server reads (model, portable graph, tokenizer), written by save(): the
    # server refuses a file that differs or is not listed (a swapped or corrupted model) before it loads
    # anything, and an export without the list unless told to serve it unverified.
    files_sha256: dict[str, str] | None = None
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.backend, str):
            self.backend = canonical_backend(self.backend)
        if not self.outputs and self.head in OUTPUT_NAMES:
            self.outputs = list(OUTPUT_NAMES[self.head])
        self.validate()

    # --- validation -------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise SidecarError on anything a server could not serve correctly."""
        problems = self._problems()
        if problems:
            raise SidecarError("; ".join(problems))

    def _problems(self) -> list[str]:
        p: list[str] = []
        if self.format_version != FORMAT_VERSION:
            p.append(
                f"format_version {self.format_version!r} is not supported (this code reads {FORMAT_VERSION})"
            )
        if self.backend not in EXPORT_BACKENDS:
            p.append(f"backend must be one of {EXPORT_BACKENDS}, got {self.backend!r}")
        for name in ("model_file", "portable_model_file"):
            value = getattr(self, name)
            if value is not None and not _inside(value):
                p.append(f"{name} must be a relative path inside the export directory, got {value!r}")
        if self.head not in OUTPUT_NAMES:
            p.append(f"head must be one of {tuple(OUTPUT_NAMES)}, got {self.head!r}")
        elif list(self.outputs) != list(OUTPUT_NAMES[self.head]):
            p.append(
                f"outputs for head {self.head!r} must be {list(OUTPUT_NAMES[self.head])}, got {self.outputs}"
            )
        if list(self.inputs) != list(INPUT_NAMES):
            p.append(f"inputs must be {list(INPUT_NAMES)}, got {self.inputs}")
        if self.precision not in EXPORT_PRECISIONS:
            p.append(f"precision must be one of {EXPORT_PRECISIONS}, got {self.precision!r}")
        p += [
            f"{n} must be a positive integer, got {getattr(self, n)!r}"
            for n in ("d_model", "n_layer", "vocab_size")
            if not positive_int(getattr(self, n))
        ]
        p += [
            f"{n} must be a positive integer, got {getattr(self.serving, n)!r}"
            for n in ("start_n_top", "end_n_top")
            if not positive_int(getattr(self.serving, n))
        ]
        p += self.serving.problems()
        if self.opset is not None and not positive_int(self.opset):
            p.append(f"opset must be a positive integer or null, got {self.opset!r}")
        seq, stride = self.serving.max_seq_len, self.serving.doc_stride
        if positive_int(seq) and positive_int(stride) and stride > seq:
            # an export's own rule (its verification windows): older sidecars hold it too
            p.append(f"doc_stride ({stride}) must not exceed max_seq_len ({seq})")
        if self.files_sha256 is not None and (
            not isinstance(self.files_sha256, dict)
            or not all(
                _inside(k) and isinstance(v, str) and _HEX64.fullmatch(v)
                for k, v in self.files_sha256.items()
            )
        ):
            p.append("files_sha256 must map file names inside the export to sha256 hex digests")
        if self.answerability is not None:
            try:
                Answerability.from_dict(self.answerability)
            except AnswerabilityError as exc:
                p.append(str(exc))
        if self.backend == TRT:
            trt = self.trt if isinstance(self.trt, dict) else {}
            if not trt:
                p.append(f"backend {TRT!r} needs a 'trt' section (min/opt/max shapes, version, path)")
            for key in ("min_shape", "opt_shape", "max_shape") if trt else ():
                shape = trt.get(key)
                if not (isinstance(shape, list) and len(shape) == 2 and all(positive_int(x) for x in shape)):
                    p.append(f"trt.{key} must be [batch, sequence], got {shape!r}")
        for name in ("exporter", "verification"):
            if not isinstance(getattr(self, name), dict):
                p.append(f"{name} must be an object")
        return p

    # --- settings the server needs --------------------------------------------------------------
    def decision(self) -> Answerability:
        """How answers are decided: the fitted answerability model, or the cls-only threshold."""
        return from_metadata(
            {"answerability": self.answerability, "no_answer_threshold": self.serving.no_answer_threshold}
        )

    @property
    def settings(self) -> dict[str, float | int]:
        """The featurisation/decoding settings as one dict (the fields of `ModelSettings`)."""
        return self.serving.model.as_dict()

    @property
    def max_batch_size(self) -> int | None:
        """The largest batch the model accepts (TensorRT engines are built for a range; ONNX has none)."""
        return self.trt["max_shape"][0] if self.trt else None

    @property
    def max_sequence_length(self) -> int | None:
        """The longest sequence a TensorRT engine accepts (None: any)."""
        return self.trt["max_shape"][1] if self.trt else None

    def model_path(self, directory: str | os.PathLike) -> Path:
        return Path(directory) / self.model_file

    def served_files(self) -> list[str]:
        """The files a server reads: the model, the portable graph (GPU providers), the tokenizer."""
        names = [self.model_file, *TOKENIZER_FILES]
        return names + ([self.portable_model_file] if self.portable_model_file else [])

    def record_files(self, directory: str | os.PathLike) -> None:
        """sha256 of each served file present in ``directory`` (save() calls it)."""
        d = Path(directory)
        self.files_sha256 = {n: sha256_file(d / n) for n in self.served_files() if (d / n).is_file()} or None

    def file_problems(self, directory: str | os.PathLike) -> list[str]:
        """What is wrong with the served files of ``directory``: a symbolic link, a path that leaves the
        directory, a file missing from ``files_sha256`` (a file swapped in with its entry removed would
        otherwise pass), a file whose sha256 differs from the one recorded. Reads every file once.
        Without any ``files_sha256`` only links and paths are checked: whether such an export may be
        served at all is the server's decision (``--allow-unhashed-model``)."""
        root = Path(directory).resolve()
        problems = []
        for name in self.served_files():
            path = root / name
            if path.is_symlink():
                problems.append(f"{name} is a symbolic link (an export holds its own files)")
                continue
            if not path.resolve().is_relative_to(root):
                problems.append(f"{name} leaves the export directory")
                continue
            if self.files_sha256 is None or not path.is_file():
                continue
            expected = self.files_sha256.get(name)
            if expected is None:
                problems.append(f"{name} is not in files_sha256 (every file a server loads must be hashed)")
            elif sha256_file(path) != expected:
                problems.append(f"{name} differs from the exported file (sha256 mismatch)")
        return problems

    # --- (de)serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        names = [f.name for f in dataclasses.fields(self) if f.name not in ("extra", "serving")]
        after = names.index("opset") + 1
        out = {name: getattr(self, name) for name in names[:after]}
        out |= dataclasses.asdict(self.serving)
        out |= {name: getattr(self, name) for name in names[after:]}
        out = {k: v for k, v in out.items() if v is not None or k in ("opset",)}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = SIDECAR_FILE) -> Sidecar:
        if not isinstance(data, Mapping):
            raise SidecarError(f"{source}: expected a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "serving"}
        serving_names = {f.name for f in dataclasses.fields(ServingSettings)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }  # noqa: E501
        missing = sorted(required - set(data))
        if missing:
            raise SidecarError(f"{source}: missing required keys {missing}")
        version = data.get("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise SidecarError(
                f"{source}: format_version {version!r} is not supported (this code reads {FORMAT_VERSION}); "
                "re-export with this version of the exporter"
            )
        kwargs = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names | serving_names}
        try:
            serving = ServingSettings(**{k: v for k, v in data.items() if k in serving_names})
            return cls(**kwargs, serving=serving, extra=extra)
        except SidecarError as exc:
            raise SidecarError(f"{source}: {exc}") from None
        except TypeError as exc:
            raise SidecarError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, directory: str | os.PathLike, *, check_files: bool = True) -> Sidecar:
        """Read and validate `directory/export.json`; with `check_files`, the model and tokenizer must exist."""
        directory = Path(directory)
        if not directory.is_dir():
            raise SidecarError(
                f"{directory}: not an export directory (it does not exist or is not a directory)"
            )
        path = directory / SIDECAR_FILE
        if not path.is_file():
            raise SidecarError(
                f"{directory}: no {SIDECAR_FILE}; export a model with `python -m export.onnx` first"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SidecarError(f"{path}: invalid JSON ({exc})") from None
        sidecar = cls.from_dict(data, source=str(path))
        if check_files:
            wanted = [sidecar.model_file, *TOKENIZER_FILES]
            if sidecar.portable_model_file:
                wanted.append(sidecar.portable_model_file)
            absent = [name for name in wanted if not (directory / name).is_file()]
            if absent:
                raise SidecarError(f"{directory}: {SIDECAR_FILE} names files that are missing: {absent}")
        return sidecar

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `directory/export.json` atomically (temporary file + rename), with the sha256 of every
        served file already in `directory`."""
        directory = Path(directory)
        self.record_files(directory)
        self.validate()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SIDECAR_FILE
        tmp = directory / f".{SIDECAR_FILE}.tmp"
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path


def _inside(name: Any) -> bool:
    """A relative path that stays inside the directory ("model.onnx", "1/model.onnx" in a Triton model)."""
    if not isinstance(name, str) or not name or "\\" in name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts
