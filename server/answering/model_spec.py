"""What the server needs to know about a model, read torch-free from an export or checkpoint directory.

An export directory holds ``export.json`` (read and validated by :mod:`qa_core.runtime.sidecar`), the model file
and the tokenizer; a checkpoint directory (``--backend torch``) holds ``config.json`` + ``metadata.json``,
read here as plain JSON. Neither path imports torch (the ONNX/TensorRT server must not), and both fail
at startup with one clear line when a directory is not what it claims to be.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qa_core.contract import INPUT_NAMES, ModelSettings, shortest_sequence
from qa_core.contract import OUTPUT_NAMES as OUTPUTS_BY_HEAD
from qa_core.runtime.backends import EXPORT_BACKENDS
from qa_core.runtime.sidecar import SIDECAR_FILE, ServingSettings, Sidecar, SidecarError
from qa_core.squad.answerability import NONE_RULE, Answerability, AnswerabilityError

logger = logging.getLogger("server")
_DEFAULTS = ServingSettings()  # where a checkpoint's metadata does not say


class ModelSpecError(ValueError):
    """The model directory cannot be served; the message says what is missing."""


@dataclass(frozen=True)
class ModelSpec:
    """Head, sequence lengths and defaults of one servable model (all the server reads from disk)."""

    name: str
    directory: Path  # where the weights/engine live (a checkpoint dir for the torch backend)
    tokenizer_dir: Path
    head: str
    kind: str  # "export" | "checkpoint"
    model_file: str | None = None
    portable_model_file: str | None = None  # the standard-ops graph GPU providers load
    export_backend: str | None = None
    precision: str = "fp32"
    # windows, answer length, threshold, beam top-k: the export's sidecar's, or the checkpoint's metadata's
    serving: ServingSettings = field(default_factory=ServingSettings)
    max_batch_size: int | None = None  # a TensorRT engine's optimisation-profile limits (None: any)
    max_engine_seq_len: int | None = None
    min_engine_seq_len: int | None = None  # shorter batches are padded up to it
    input_names: tuple[str, ...] = INPUT_NAMES
    output_names: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)
    answerability: Answerability | None = None  # None: sigmoid(cls) against no_answer_threshold

    @property
    def decision(self) -> Answerability:
        """How answers are decided: the fitted answerability model, or the cls-only threshold."""
        return self.answerability or Answerability.cls_only(self.serving.no_answer_threshold)

    def public(self) -> dict[str, Any]:
        """JSON-ready metadata for ``GET /v1/model`` (no absolute paths)."""
        return {
            "name": self.name,
            "head": self.head,
            "precision": self.precision,
            **dataclasses.asdict(self.serving),
            "inputs": list(self.input_names),
            "outputs": list(self.output_names),
            "source": self.kind,
            "export_backend": self.export_backend,
            "answerability": answerability_summary(self.decision),
        }


def decision_rule(a: Answerability) -> str:
    """The model's own rule, as an answer's ``rule`` names it: ``cls`` (sigmoid of the <cls> logit
    against a threshold), a fitted model's ``threshold`` or ``expected_gain``, or ``none`` (a fitted
    model that did not credibly beat answering none: it answers nothing; older exports stored that
    as a threshold of 0 with ``beats_no_answer`` false)."""
    if a.report.get("kind") == "cls":
        return "cls"
    return NONE_RULE if a.report.get("beats_no_answer") is False else a.rule


def answerability_summary(a: Answerability) -> dict[str, Any]:
    """What ``GET /v1/model`` says of the decision rule (its cross-validated estimate, when fitted)."""
    cv = a.report.get("cv") or {}
    return {
        "kind": "cls" if decision_rule(a) == "cls" else "fitted",
        "features": list(a.model.features),
        "calibration": a.calibration,
        "rule": a.rule,
        "threshold": a.threshold if a.rule == "threshold" else None,
        "beats_no_answer": a.report.get("beats_no_answer"),
        "cv_f1": cv.get("f1"),
        "cv_no_answer_f1": cv.get("no_answer_f1"),
        "cv_roc_auc": cv.get("roc_auc"),
        "decision": a.report.get("decision"),  # one line: the rule and why (or why it answers nothing)
        "reranker": None
        if a.reranker is None
        else {"top_k": a.reranker.top_k, "features": list(a.reranker.model.features)},
    }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelSpecError(f"{path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ModelSpecError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ModelSpecError(f"{path}: expected a JSON object")
    return data


def _int(data: dict[str, Any], key: str, default: int, where: Path) -> int:
    value = data.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelSpecError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return value


def _head(value: Any, where: Path) -> str:
    if value not in OUTPUTS_BY_HEAD:
        raise ModelSpecError(f"{where}: unknown QA head {value!r}; expected one of {sorted(OUTPUTS_BY_HEAD)}")
    return str(value)


def _lengths(data: dict[str, Any], where: Path) -> ServingSettings:
    """A checkpoint's serving settings: its metadata's `ModelSettings` (defaults where it does not say, as
    an export's sidecar has) and the beam head's top-k."""
    try:
        settings = ModelSettings.from_metadata(data)
    except ValueError as exc:
        raise ModelSpecError(f"{where}: {exc}") from None
    top_k = {n: _int(data, n, getattr(_DEFAULTS, n), where) for n in ("start_n_top", "end_n_top")}
    return ServingSettings.of(settings, **top_k)


def _need_tokenizer(directory: Path) -> None:
    if not (directory / "spiece.model").is_file():
        raise ModelSpecError(f"{directory}: no spiece.model (the tokenizer must be saved beside the model)")


def load_export_spec(
    directory: str | Path, backend: str = "onnx", *, allow_unhashed: bool = False
) -> ModelSpec:
    """Read and validate an export directory through ``qa_core.runtime.sidecar`` (torch-free).

    The sidecar's backend must fit the server's: an ONNX export for ``onnx``, an engine for ``trt``.
    Every served file must match its recorded sha256; an export that records none (an older exporter,
    or a sidecar someone stripped) is refused unless ``allow_unhashed`` (``--allow-unhashed-model``).
    """
    d = Path(directory)
    try:
        sc = Sidecar.load(d)
    except SidecarError as exc:
        raise ModelSpecError(str(exc)) from None
    problems = sc.file_problems(d)
    if problems:
        raise ModelSpecError(f"{d}: {'; '.join(problems)}; export again, or restore the exported files")
    if sc.files_sha256 is None:
        if not allow_unhashed:
            raise ModelSpecError(
                f"{d}: {SIDECAR_FILE} records no file hashes (files_sha256), so its files cannot be verified; "
                "export it again, or serve it unverified with --allow-unhashed-model"
            )
        logger.warning(
            "%s: the export records no file hashes (--allow-unhashed-model): files not verified", d
        )
    if backend in EXPORT_BACKENDS and sc.backend != backend:
        raise ModelSpecError(f"{d}: the export is for {sc.backend!r}; serve it with --backend {sc.backend}")
    return ModelSpec(
        name=str(sc.extra.get("name") or d.resolve().name),
        directory=d,
        tokenizer_dir=d,
        head=sc.head,
        kind="export",
        model_file=sc.model_file,
        portable_model_file=sc.portable_model_file,
        export_backend=sc.backend,
        precision=sc.precision,
        serving=dataclasses.replace(sc.serving, no_answer_threshold=float(sc.serving.no_answer_threshold)),
        max_batch_size=sc.max_batch_size,
        max_engine_seq_len=sc.max_sequence_length,
        # an engine's profile minimum, else the graph's own (the beam head's in-graph top-k needs k tokens)
        min_engine_seq_len=sc.trt["min_shape"][1]
        if sc.trt
        else shortest_sequence(sc.head, sc.serving.start_n_top, sc.serving.end_n_top),
        input_names=tuple(sc.inputs),
        output_names=tuple(sc.outputs),
        raw=sc.to_dict(),
        answerability=Answerability.from_dict(sc.answerability) if sc.answerability is not None else None,
    )


def load_checkpoint_spec(directory: str | Path) -> ModelSpec:
    """Read a fine-tuned checkpoint's ``config.json`` kind and ``metadata.json`` (no weights, no torch)."""
    d = Path(directory)
    config = _read_json(d / "config.json") if (d / "config.json").is_file() else None
    if config is None:
        raise ModelSpecError(f"{d}: no config.json; is this a checkpoint directory?")
    meta = _read_json(d / "metadata.json") if (d / "metadata.json").is_file() else {}
    kind = (config.get("xlnet_qa") or {}).get("kind") or ""
    head = meta.get("head") or (kind.split(":", 1)[1] if kind.startswith("qa:") else None)
    if head is None:
        raise ModelSpecError(f"{d}: not a question-answering checkpoint (kind {kind or 'unknown'!r})")
    head = _head(head, d / "metadata.json")
    _need_tokenizer(d)
    try:
        answerability = Answerability.from_dict(meta["answerability"]) if meta.get("answerability") else None
    except AnswerabilityError as exc:
        raise ModelSpecError(f"{d / 'metadata.json'}: {exc}") from None
    return ModelSpec(
        name=str(meta.get("name") or d.resolve().name),
        directory=d,
        tokenizer_dir=d,
        head=head,
        kind="checkpoint",
        output_names=OUTPUTS_BY_HEAD[head],
        raw=meta,
        answerability=answerability,
        serving=_lengths(meta, d / "metadata.json"),
    )


def resolve_spec(model_dir: str | Path, backend: str, *, allow_unhashed: bool = False) -> ModelSpec:
    """The spec for ``--model DIR --backend B`` (``allow_unhashed``: ``--allow-unhashed-model``).

    onnx/trt need an export directory. torch takes a checkpoint directory, or an export directory whose
    sidecar names its ``source_checkpoint`` (then the sidecar's lengths and threshold are kept, so both
    backends serve the same model the same way).
    """
    d = Path(model_dir)
    if not d.is_dir():
        raise ModelSpecError(f"{d}: model directory not found")
    if backend != "torch":
        spec = load_export_spec(d, backend, allow_unhashed=allow_unhashed)
        max_seq_len = spec.serving.max_seq_len
        if spec.max_engine_seq_len is not None and spec.max_engine_seq_len < max_seq_len:
            raise ModelSpecError(
                f"{d}: the engine accepts at most {spec.max_engine_seq_len} tokens, the sidecar's max_seq_len is "
                f"{max_seq_len}"
            )
        return spec
    if (d / "config.json").is_file():
        return load_checkpoint_spec(d)
    spec = load_export_spec(d, backend, allow_unhashed=allow_unhashed)
    source = spec.raw.get("source_checkpoint")
    if not source:
        raise ModelSpecError(
            f"{d}: --backend torch needs a checkpoint directory or a sidecar with source_checkpoint"
        )
    # Absolute, relative to the export directory, or relative to where the export was run.
    candidates = [Path(source)] if Path(source).is_absolute() else [d / source, Path(source)]
    ckpt = next((c for c in candidates if (c / "config.json").is_file()), None)
    if ckpt is None:
        raise ModelSpecError(f"{d}: source_checkpoint {source!r} is not a checkpoint directory")
    return ModelSpec(**{**spec.__dict__, "directory": ckpt, "kind": "checkpoint"})
