"""The inference backends, each under one canonical name, and the older spellings still read.

The server's ``--backend`` and an export's ``export.json`` (``backend``) name a backend the same way.
Exports written before the names were unified say ``tensorrt``; :func:`canonical_backend` maps such an
old spelling to its canonical name, here and nowhere else.
"""

from __future__ import annotations

from typing import Literal, get_args

ServerBackend = Literal["onnx", "trt", "torch", "null"]
"""What ``python -m server --backend`` runs (onnxruntime, TensorRT engines, torch eager; ``null``: fixed
outputs and no model, to measure the server itself)."""

SERVER_BACKENDS: tuple[str, ...] = get_args(ServerBackend)
ONNX, TRT, TORCH, NULL = SERVER_BACKENDS
EXPORT_BACKENDS: tuple[str, ...] = (ONNX, TRT)
"""What an export directory can hold (``export.json``'s ``backend``); torch serves checkpoints."""

BACKEND_ALIASES: dict[str, str] = {"tensorrt": TRT}
"""Old spellings, still accepted where they were written: ``tensorrt`` in earlier ``export.json`` files."""


def canonical_backend(name: str) -> str:
    """The canonical name for ``name`` (an old spelling maps to it; anything else is returned as is)."""
    return BACKEND_ALIASES.get(name, name)
