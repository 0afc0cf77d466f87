"""The server runs from what its CPU image carries (deploy/Dockerfile: the serving core, the server and
the schema it shares with the SDK) with nothing of training importable: train/, export/, bench/,
harness/ and torch blocked in the child, the shipped int8 model is served and answers."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

from deploy_kit import DOCKERFILES, SERVER_IMAGE_PACKAGES, copied_sources
from paths import REPO
from server_helpers import OK, post

from harness.server_process import ServerProcess, child_env

SHIPPED = REPO / "models" / "squad2-small-int8"
BLOCKED = ("train", "export", "bench", "harness", "torch")


def image_tree(root: Path) -> Path:
    """The repository's packages the CPU image copies, and a sitecustomize that makes the rest
    unimportable (an editable install would otherwise find them)."""
    assert set(SERVER_IMAGE_PACKAGES) <= copied_sources(DOCKERFILES["cpu"])
    for name in SERVER_IMAGE_PACKAGES:
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    blocked = ", ".join(repr(n) for n in BLOCKED)
    (root / "sitecustomize.py").write_text(
        f"import sys\nfor name in ({blocked},):\n    sys.modules[name] = None\n"
    )
    return root


def test_the_server_runs_with_nothing_of_training(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "image")
    probe = subprocess.run(
        [sys.executable, "-c", "import server.app, qa_core; print(server.app.__file__)\nimport train"],
        cwd=root,
        env=child_env(None, root),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.stdout.startswith(str(root)), probe.stdout + probe.stderr  # the copy, not the checkout
    assert "ModuleNotFoundError: import of train halted" in probe.stderr, probe.stderr[-500:]
    listening = socket.create_server(("127.0.0.1", 0))
    with ServerProcess(SHIPPED, repo=root, listen_socket=listening, log_path=tmp_path / "server.log") as s:
        r = post(s.url + "/v1/answer", OK)
        assert r.status_code == 200 and "answer" in r.json(), r.text
