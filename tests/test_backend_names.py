"""Each backend has one name, shared by the server's --backend and export.json; old spellings still read."""

from __future__ import annotations

from typing import get_args

from qa_core.runtime.backends import EXPORT_BACKENDS, SERVER_BACKENDS, TRT, canonical_backend
from server.settings import ServerSettings


def test_one_name_per_backend():
    """The server's --backend takes SERVER_BACKENDS (exports name one of EXPORT_BACKENDS, a subset: the
    torch backend serves a checkpoint, null nothing); no other module keeps its own tuple."""
    assert {"onnx", "trt", "torch", "null"} <= set(SERVER_BACKENDS)  # the documented ones, at least
    assert get_args(ServerSettings.model_fields["backend"].annotation) == SERVER_BACKENDS
    assert set(EXPORT_BACKENDS) < set(SERVER_BACKENDS)


def test_old_spellings_map_to_the_canonical_name():
    assert canonical_backend("tensorrt") == TRT
    assert [canonical_backend(name) for name in SERVER_BACKENDS] == list(SERVER_BACKENDS)
    assert canonical_backend("unknown") == "unknown"  # left for validation to refuse
