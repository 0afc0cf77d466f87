"""Inference backends behind one interface, found through one registry: each is imported only when
chosen (torch only for ``torch``), and the server asks it, not an if-chain, what it checks before
listening, what it rules out in a model and how it is built.

A new backend is a module here with a :class:`~server.backends.base.Backend` subclass, its name in
:mod:`qa_core.runtime.backends` and its line in :data:`REGISTRY`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from qa_core.runtime.backends import NULL, ONNX, SERVER_BACKENDS, TORCH, TRT
from server.answering.model_spec import ModelSpec
from server.backends.base import Backend, BackendUnavailable, batch_limit, dummy_batch
from server.settings import ServerSettings


@dataclass(frozen=True)
class Registered:
    """Where a backend lives, and a package it cannot be imported without (checked first, so that a
    missing install is one line, not an ImportError)."""

    module: str
    class_name: str
    needs: str | None = None
    install: str = ""


REGISTRY: dict[str, Registered] = {
    ONNX: Registered("server.backends.onnx", "OnnxBackend", "onnxruntime", "pip install 'xlnet-qa[serve]'"),
    TRT: Registered("server.backends.trt", "TrtBackend"),
    TORCH: Registered("server.backends.torch", "TorchBackend", "torch", "pip install 'xlnet-qa[train]'"),
    NULL: Registered("server.backends.null", "NullBackend"),
}


def backend_class(name: str) -> type[Backend]:
    """The class registered under ``name``, imported now (its package checked first)."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(SERVER_BACKENDS)}")
    if entry.needs and importlib.util.find_spec(entry.needs) is None:
        raise BackendUnavailable(f"--backend {name} needs {entry.needs} ({entry.install})")
    found: type[Backend] = getattr(importlib.import_module(entry.module), entry.class_name)
    return found


def preflight(settings: ServerSettings) -> None:
    """Checks before the server starts listening (missing packages, a GPU provider that does not run a
    probe session, no GPU, an unusable cache directory -> BackendUnavailable with one line saying what
    to do). Fast: the probe session is a tiny model."""
    backend_class(settings.backend).preflight(settings)


def check_spec(spec: ModelSpec, settings: ServerSettings) -> None:
    """What the model itself rules out before listening (an int8 export on a GPU provider)."""
    backend_class(settings.backend).check_spec(spec, settings)


def create_backend(spec: ModelSpec, settings: ServerSettings) -> Backend:
    """Build the backend named by ``settings.backend`` for ``spec`` (slow: loads the model)."""
    return backend_class(settings.backend).from_settings(spec, settings)


__all__ = [
    "REGISTRY",
    "Backend",
    "BackendUnavailable",
    "batch_limit",
    "check_spec",
    "backend_class",
    "create_backend",
    "dummy_batch",
    "preflight",
]
