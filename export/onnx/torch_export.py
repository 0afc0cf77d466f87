"""The PyTorch side of the ONNX export: load a checkpoint as a QA model, trace it, run it as the reference."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from export.onnx.graph import ensure_node_names, fold_static_ifs
from qa_core.contract import INPUT_NAMES
from qa_core.runtime.runner import Feeds, Runner
from train.model import HEADS
from train.model import checkpoint as ckpt_io
from train.model import contrib_attention as contrib
from train.model.inference import QAInference

PER_TOKEN_OUTPUTS = ("start_logits", "end_logits")


def load_qa_checkpoint(path: Path, head: str | None, warn: Callable[[str], None]) -> ckpt_io.LoadedCheckpoint:
    """The checkpoint as a QA model; a fresh head (with a loud `warn`) only when asked for with `head`."""
    if not path.exists():
        raise FileNotFoundError(f"--checkpoint {path}: no such directory")
    loaded = ckpt_io.load(path)
    if loaded.kind.startswith("qa:") and head in (None, loaded.kind[3:]):
        return loaded
    if head is None:
        raise ValueError(
            f"--checkpoint {path}: is a {loaded.kind!r} model without a QA head; pass --head "
            f"{{{','.join(HEADS)}}} to export it with a freshly initialised (untrained) head"
        )
    source_kind = loaded.kind
    torch.manual_seed(0)
    loaded = ckpt_io.load(path, head=head)
    bar = "!" * 78
    warn(
        f"{bar}\nWARNING: {path} is a {source_kind!r} checkpoint without a trained {head!r} head: the\n"
        f"exported {head!r} head is RANDOMLY INITIALISED and its answers are meaningless until the model\n"
        f"is fine-tuned (python -m train.finetune).\n{bar}"
    )
    loaded.metadata = {**loaded.metadata, "untrained_head": True}
    return loaded


def weights_file(path: Path) -> Path | None:
    """The checkpoint's weights file (its sha256 identifies the export's source)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return path / name
    return None


def torch_runner(module: QAInference) -> Runner:
    """PyTorch fp32 as a runner: the reference every exported graph is checked against."""

    @torch.no_grad()
    def run_torch(feeds: Feeds) -> list[np.ndarray]:
        outs = module(*(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in INPUT_NAMES))
        return [o.detach().cpu().numpy() for o in outs]

    return run_torch


def export_graph(
    module: QAInference, path: Path, opset: int, trace_feeds: Feeds, *, contrib_attention: bool = False
) -> dict[str, Any]:
    """TorchScript ONNX export with dynamic batch/sequence axes, then If folding; returns facts for the sidecar.
    With `contrib_attention`, each layer's attention is onnxruntime's ``com.microsoft::MultiHeadAttention``
    (`train.model.contrib_attention`: a CPU graph, not a portable one)."""
    names = list(module.names)
    axes: dict[str, dict[int, str]] = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    for n in names:
        axes[n] = {0: "batch", 1: "sequence"} if n in PER_TOKEN_OUTPUTS else {0: "batch"}
    args = tuple(torch.from_numpy(trace_feeds[n]) for n in INPUT_NAMES)
    with warnings.catch_warnings(), contrib.exporting(contrib_attention):
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is a deliberate choice
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=names,
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
            custom_opsets={contrib.DOMAIN: contrib.OPSET} if contrib_attention else None,
        )
    model = onnx.load(str(path))
    model, folded = fold_static_ifs(model)
    ensure_node_names(model)
    onnx.save(model, str(path))
    return {"trace_shape": list(trace_feeds["input_ids"].shape), "folded_ifs": folded}
