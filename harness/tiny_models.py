"""Tiny random QA checkpoints and exports for tests and demos (seconds on a CPU, no downloads).

Weights are random but not degenerate: biases and LayerNorm parameters are perturbed so that every
parameter changes the outputs, and exports are checked exactly as real ones are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from qa_core.tokenizer import XLNetTokenizer
from train.model import XLNetConfig, XLNetForQuestionAnswering, checkpoint
from train.model.heads import HEAD_MODULES

TINY = dict(d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0, start_n_top=3, end_n_top=2)


def perturb(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Add noise to biases, norms and the match embedding (zero/one at init), so a wrong one shows."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "bias" in name or "LayerNorm" in name or "layer_norm" in name or name.endswith("match_emb"):
                param.add_(torch.randn_like(param) * scale)
    return model


def tiny_qa_checkpoint(
    directory: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    head: str = "shallow",
    *,
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
    logit_scale: float = 1.0,
    **config: Any,
) -> Path:
    """Save a random `head` QA model (vocabulary = the tokenizer's) with the tokenizer; returns the directory.

    ``logit_scale`` multiplies the span heads' last projections: a random model's start/end logits
    stay within ~0.5 of each other, so every span is a near-tie and any output "agrees"; scaled, the
    best spans lead by real margins, as a trained model's do.
    """
    tokenizer = XLNetTokenizer.from_dir(tokenizer_dir)
    torch.manual_seed(seed)
    cfg = XLNetConfig(vocab_size=tokenizer.vocab_size, **{**TINY, **config})
    model = perturb(XLNetForQuestionAnswering(cfg, head=head)).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in HEAD_MODULES[head].span_scorers:
                    param.mul_(logit_scale)
    return checkpoint.save(model, directory, tokenizer=tokenizer, metadata={"head": head, **(metadata or {})})


def tiny_onnx_export(
    directory: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    head: str = "shallow",
    *,
    export: Mapping[str, Any] | None = None,
    **kw: Any,
) -> Path:
    """A checkpoint (beside `directory`, made with ``kw``) exported to `directory` by the ONNX exporter;
    ``export`` holds `OnnxExportOptions` fields (``{"precision": "fp16", "verify": False}``)."""
    from export.onnx.exporter import export_onnx
    from export.onnx.options import OnnxExportOptions

    directory = Path(directory)
    ckpt = tiny_qa_checkpoint(directory.with_name(directory.name + "-checkpoint"), tokenizer_dir, head, **kw)
    export_onnx(OnnxExportOptions(checkpoint=ckpt, out=directory, **(export or {})))
    return directory
