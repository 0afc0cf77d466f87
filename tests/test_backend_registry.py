"""The backend registry is the one place the server turns a backend's name into code: every name
``--backend`` takes is registered, each entry imports to a Backend subclass with its own ``name``, and an
unknown or uninstalled backend is one line (BackendUnavailable), never an ImportError."""

from __future__ import annotations

import re

import pytest
from paths import REPO

from qa_core.runtime.backends import SERVER_BACKENDS
from server.backends import REGISTRY, Backend, BackendUnavailable, Registered, backend_class


def test_every_server_backend_is_registered_once() -> None:
    assert tuple(REGISTRY) == SERVER_BACKENDS


@pytest.mark.parametrize("name", SERVER_BACKENDS)
def test_each_entry_is_a_backend_of_that_name(name: str) -> None:
    cls = backend_class(name)
    assert issubclass(cls, Backend) and cls.name == name


# settings.py asks one question of its own values (does loading build TensorRT engines?), chooses nothing
ASKS_ITS_OWN_VALUES = {"server/settings.py"}


def test_no_module_chooses_a_backend_by_an_if_chain() -> None:
    """Turning a backend's name into what to check and build is the registry's job, not a module's."""
    chain = re.compile(r"\bbackend\s*==\s*(\"|')?(?:onnx|trt|torch|null|ONNX|TRT|TORCH|NULL)\b")
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "server").rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in ASKS_ITS_OWN_VALUES
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if chain.search(line)
    ]
    assert not found, found


def test_unknown_and_uninstalled_backends_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        BackendUnavailable, match="unknown backend 'tpu'; choose one of onnx, trt, torch, null"
    ):
        backend_class("tpu")
    missing = Registered(
        "server.backends.null", "NullBackend", needs="no_such_package_xyz", install="pip install it"
    )
    monkeypatch.setitem(REGISTRY, "null", missing)
    with pytest.raises(
        BackendUnavailable, match=r"--backend null needs no_such_package_xyz \(pip install it\)"
    ):
        backend_class("null")
