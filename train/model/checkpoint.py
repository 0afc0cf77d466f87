"""Load and save models: our checkpoint directories and HuggingFace XLNet directories alike.

A checkpoint directory holds `config.json` (HF-compatible XLNet config, our extras in `xlnet_qa`),
`model.safetensors` (HF key names), optionally `spiece.model` + `tokenizer_config.json`, and
`metadata.json` (anything the training run wants to pass on: no-answer threshold, head, metrics).
Weights are read with safetensors or `torch.load(weights_only=True)`, never unrestricted pickle.
Writes are atomic: everything goes to a temporary sibling directory that is renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from qa_core.heads import REGISTRY
from train.common.atomic_dir import atomic_directory, fsync_directory
from train.model import XLNetConfig, XLNetForQuestionAnswering, XLNetLMHeadModel, XLNetModel

# config.json's "architectures" name per model kind ("qa:<head>" from the head registry), and back.
OUR_ARCHITECTURES = {
    "base": "XLNetModel",
    "lm": "XLNetLMHeadModel",
    **{f"qa:{name}": spec.architecture for name, spec in REGISTRY.items()},
}
HF_ARCHITECTURES = {architecture: kind for kind, architecture in OUR_ARCHITECTURES.items()}


class CheckpointError(ValueError):
    """The directory is not a checkpoint we can read; the message says what is missing."""


@dataclass
class LoadedCheckpoint:
    model: nn.Module
    config: XLNetConfig
    kind: str  # "base" | "lm" | "qa:<head>"
    tokenizer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __iter__(self):
        """`model, tokenizer = load(path)` works too."""
        return iter((self.model, self.tokenizer))


def model_kind(model: nn.Module) -> str:
    if isinstance(model, XLNetForQuestionAnswering):
        return f"qa:{model.head}"
    if isinstance(model, XLNetLMHeadModel):
        return "lm"
    if isinstance(model, XLNetModel):
        return "base"
    raise TypeError(f"not an XLNet model: {type(model).__name__}")


def build_model(config: XLNetConfig, kind: str) -> nn.Module:
    if kind == "base":
        return XLNetModel(config)
    if kind == "lm":
        return XLNetLMHeadModel(config)
    if kind.startswith("qa:"):
        return XLNetForQuestionAnswering(config, head=kind.split(":", 1)[1])
    raise CheckpointError(f"unknown model kind {kind!r}")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    st = path / "model.safetensors"
    if st.exists():
        return load_file(str(st))
    bin_file = path / "pytorch_model.bin"
    if bin_file.exists():
        try:
            return torch.load(bin_file, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling refusal becomes one clear message
            raise CheckpointError(f"{bin_file}: cannot be read safely (weights_only=True): {exc}") from exc
    raise CheckpointError(f"{path}: no model.safetensors or pytorch_model.bin")


def _infer_kind(state: dict[str, torch.Tensor], config_json: dict[str, Any]) -> str:
    ours = config_json.get("xlnet_qa", {}).get("kind")
    if ours:
        return ours
    for arch in config_json.get("architectures") or []:
        if arch in HF_ARCHITECTURES:
            return HF_ARCHITECTURES[arch]
    if "qa_outputs.weight" in state:
        return "qa:simple"
    if "start_logits.dense.weight" in state:
        return "qa:beam"
    if "lm_loss.bias" in state:
        return "lm"
    return "base"


def _backbone_only(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys of the XLNetModel alone, whatever head the file was saved with."""
    if any(k.startswith("transformer.") for k in state):
        return {k[len("transformer.") :]: v for k, v in state.items() if k.startswith("transformer.")}
    return dict(state)


def _adapt_state(
    state: dict[str, torch.Tensor], model: nn.Module, src_kind: str, dst_kind: str
) -> dict[str, Any]:
    """Reshape a state dict saved for one kind of model to the keys of another (e.g. LM -> QA init)."""
    backbone = _backbone_only(state)
    if dst_kind == "base":
        return backbone
    out = {f"transformer.{k}": v for k, v in backbone.items()}
    if dst_kind == src_kind:
        out.update({k: v for k, v in state.items() if not k.startswith("transformer.")})
    if dst_kind == "lm":
        out.setdefault(
            "lm_loss.bias", state.get("lm_loss.bias", torch.zeros(cast(XLNetConfig, model.config).vocab_size))
        )
    return out


def _check_tied_biases(state: dict[str, torch.Tensor], config: XLNetConfig) -> XLNetConfig:
    """HF always stores per-layer biases; tie them only when the file really holds equal values."""
    if config.untie_r:
        return config
    prefix = "transformer." if any(k.startswith("transformer.") for k in state) else ""
    for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
        first = state.get(f"{prefix}layer.0.rel_attn.{name}")
        for i in range(1, config.n_layer):
            other = state.get(f"{prefix}layer.{i}.rel_attn.{name}")
            if first is not None and other is not None and not torch.equal(first, other):
                return config.replace(untie_r=True)
    return config


def _read_config_json(path: Path) -> dict[str, Any]:
    """config.json of a checkpoint directory that is complete (not mid-save)."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (expected config.json + model weights)")
    if (path / STAGING / "m").is_dir():
        raise CheckpointError(
            f"{path}: a save into it was interrupted, so its files may come from two saves; resume the run "
            f"(--resume finishes the save) or call train.model.checkpoint.finish_interrupted_save({str(path)!r})"
        )
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{path}: no config.json; is this an XLNet checkpoint directory?")
    try:
        return json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_file}: invalid JSON ({exc})") from exc


def read_config(path: str | os.PathLike) -> XLNetConfig:
    """The model config of a checkpoint (ours or HF) without reading its weights: cheap checks first."""
    return XLNetConfig.from_hf_dict(_read_config_json(Path(path)))


def _check_tied_lm_head(state: dict[str, torch.Tensor], path: Path) -> None:
    """Our LM head is the word embedding (HF ties lm_loss.weight to it, the original shares one
    lookup table); a file whose lm_loss.weight holds other values cannot be loaded without loss."""
    head = state.get("lm_loss.weight")
    embedding = state.get("transformer.word_embedding.weight")
    if head is not None and embedding is not None and not torch.equal(head, embedding):
        raise CheckpointError(
            f"{path}: lm_loss.weight differs from transformer.word_embedding.weight (an untied LM head, "
            "tie_word_embeddings false); this model ties them as HF's XLNetLMHeadModel does by default"
        )


def load(
    path: str | os.PathLike,
    *,
    kind: str | None = None,
    head: str | None = None,
    config_overrides: dict[str, Any] | None = None,
    strict: bool = True,
) -> LoadedCheckpoint:
    """Load our checkpoint or an HF XLNet directory.

    `kind` ("base", "lm", "qa:<head>") or `head` asks for a different model than the file holds:
    the backbone is carried over and the new head starts from fresh weights (e.g. pretraining ->
    fine-tuning); `strict` then applies to the backbone only.
    """
    path = Path(path)
    config_json = _read_config_json(path)
    config = XLNetConfig.from_hf_dict(config_json)
    stored_match = config.question_match
    if config_overrides:
        config = config.replace(**config_overrides)
    state = _read_weights(path)
    _check_tied_lm_head(state, path)
    config = _check_tied_biases(state, config)
    src_kind = _infer_kind(state, config_json)
    dst_kind = kind or (f"qa:{head}" if head else src_kind)
    model = build_model(config, dst_kind)
    new_state = _adapt_state(state, model, src_kind, dst_kind)
    new_state.pop("lm_loss.weight", None)  # tied to the word embedding
    missing, unexpected = model.load_state_dict(new_state, strict=False)
    missing = [k for k in missing if k != "lm_loss.weight"]
    if not stored_match:  # switched on by an override: starts at zero
        missing = [k for k in missing if k != "transformer.match_emb"]
    same_head = src_kind == dst_kind
    if strict:
        problems = [k for k in missing if same_head or k.startswith("transformer.") or dst_kind == "base"]
        if problems or (same_head and unexpected):
            raise CheckpointError(
                f"{path}: weights do not fit a {dst_kind} model: missing {problems[:5]}, unexpected {unexpected[:5]}"
            )
    metadata: dict[str, Any] = {}
    if (path / "metadata.json").exists():
        metadata = json.loads((path / "metadata.json").read_text())
    tokenizer = None
    if (path / "spiece.model").exists():
        from qa_core.tokenizer import XLNetTokenizer

        tokenizer = XLNetTokenizer.from_dir(path)
    model.eval()
    return LoadedCheckpoint(
        model=model,
        config=cast(XLNetConfig, model.config),
        kind=dst_kind,
        tokenizer=tokenizer,
        metadata=metadata,
        path=path,
    )


def state_dict_for_saving(model: nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous, unshared tensors (tied biases are written once per layer, as HF expects)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if key == "lm_loss.weight":
            continue
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise FloatingPointError(f"refusing to save non-finite weights ({key} holds NaN or infinity)")
        out[key] = value.detach().to("cpu").contiguous().clone()
    return out


STAGING = ".model-staging"  # where save_into stages a checkpoint before moving its files in
# Moved in this order: weights first, config (what makes a directory a checkpoint) last.
STAGED_FILES = ("model.safetensors", "spiece.model", "tokenizer_config.json", "metadata.json", "config.json")


def save(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    tokenizer: Any = None,
    metadata: dict[str, Any] | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> Path:
    """Write a checkpoint that `load` reads and that `transformers` loads directly where HF has the model."""
    directory = Path(directory)
    kind = model_kind(model)
    config = cast(XLNetConfig, model.config)
    with atomic_directory(directory) as tmp:
        cfg = config.to_hf_dict(OUR_ARCHITECTURES[kind])
        cfg["xlnet_qa"] = {"kind": kind, "format_version": 1}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        try:
            save_file(state_dict_for_saving(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        except SafetensorError as exc:  # its I/O errors (disk full, file-size limit) are not OSErrors
            raise OSError(f"writing model.safetensors failed: {exc}") from None
        if tokenizer is not None:
            tokenizer.save(tmp)
        (tmp / "metadata.json").write_text(json.dumps(metadata or {}, indent=2, sort_keys=True))
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
    return directory


def save_into(
    model: nn.Module,
    directory: str | os.PathLike,
    *,
    tokenizer: Any = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint files into an existing run directory (beside metrics, plots, ...).

    Each file is written to a temporary name and renamed, weights before config, so `load(directory)`
    sees either the previous model or the new one.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    finish_interrupted_save(directory)
    with atomic_directory(directory / STAGING) as tmp:
        save(model, tmp / "m", tokenizer=tokenizer, metadata=metadata)
    finish_interrupted_save(directory)
    return directory


def finish_interrupted_save(directory: str | os.PathLike) -> bool:
    """Move a complete staged save's remaining files into ``directory`` (roll forward).

    ``save_into`` stages the whole checkpoint (it appears at once, complete) and then renames its files
    one by one; a kill between two renames leaves the staged rest, and this finishes the job, so the
    directory ends with one save's files, never a mix. Returns whether there was anything to finish.
    """
    directory = Path(directory)
    staging = directory / STAGING
    staged = staging / "m"
    if not staged.is_dir():
        shutil.rmtree(staging, ignore_errors=True)  # empty or foreign: nothing staged completely
        return False
    for name in STAGED_FILES:
        if (staged / name).exists():
            os.replace(staged / name, directory / name)
    fsync_directory(directory)
    shutil.rmtree(staging, ignore_errors=True)
    return True
