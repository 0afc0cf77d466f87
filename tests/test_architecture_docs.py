"""ARCHITECTURE.md is the map of the tree: every package is on its code tree, every path it names
exists, every test an invariant cites is there, the top of ``train/`` and ``export/`` holds only the
user's commands, and ``server/`` is grouped by concern."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

ROOMS = ("qa_core", "train", "export", "server")


def packages() -> list[str]:
    """Every package below the three rooms, as 'train/engine/' (the rooms themselves excluded)."""
    found = []
    for room in ROOMS:
        for init in sorted((REPO / room).rglob("__init__.py")):
            folder = init.parent.relative_to(REPO)
            if folder.parts[1:] and "__pycache__" not in folder.parts:
                found.append("/".join(folder.parts) + "/")
    return found


def code_tree() -> str:
    """The tree block of ARCHITECTURE.md's code map."""
    return (REPO / "ARCHITECTURE.md").read_text().split("## Code map", 1)[1].split("```", 2)[1]


def layout_paths(block: str) -> list[str]:
    """The paths the layout block names: its tree indentation turned into whole paths."""
    paths: list[str] = []
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        m = re.match(r"^( *)([\w.]+/)(?=\s|$)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        parents = [(i, p) for i, p in parents if i < indent]
        path = (parents[-1][1] if parents else "") + name
        parents.append((indent, path))
        paths.append(path)
    return paths


@pytest.mark.parametrize("package", packages())
def test_every_package_is_on_the_map(package: str) -> None:
    assert package in layout_paths(code_tree()), f"{package} missing from ARCHITECTURE.md's code tree"


def test_every_folder_the_code_tree_names_exists() -> None:
    paths = layout_paths(code_tree())
    assert len(paths) >= len(packages()), paths
    missing = [p for p in paths if not (REPO / p).is_dir()]
    assert not missing, f"ARCHITECTURE.md's code tree names folders that do not exist: {missing}"


def test_the_server_is_grouped_by_concern() -> None:
    """A newcomer's `ls server/` shows the concerns (at most 12 entries), and each is on the map."""
    entries = sorted(p.name for p in (REPO / "server").iterdir() if p.name != "__pycache__")
    assert len(entries) <= 12, entries
    folders = [f"server/{name}/" for name in entries if (REPO / "server" / name).is_dir()]
    assert set(folders) <= set(layout_paths(code_tree())), folders


def is_command(path: Path) -> bool:
    """A module that runs as a program: it has an ``if __name__ == "__main__":`` block."""
    tree = ast.parse(path.read_text())
    return any(
        isinstance(n, ast.If)
        and isinstance(n.test, ast.Compare)
        and ast.unparse(n.test) == "__name__ == '__main__'"
        for n in tree.body
    )


@pytest.mark.parametrize("room", ["train", "export"])
def test_the_top_of_train_and_export_holds_only_commands(room: str) -> None:
    """A newcomer's `ls train/` shows what they can run; the engine, recipes and libraries are folders."""
    architecture = (REPO / "ARCHITECTURE.md").read_text()
    for module in sorted((REPO / room).glob("*.py")):
        if module.name == "__init__.py":
            continue
        assert is_command(module), f"{room}/{module.name} is not a command: move it into a package"
        assert f"`{module.name}`" in architecture, f"{room}/{module.name} missing from ARCHITECTURE.md"


def test_every_path_the_architecture_names_exists() -> None:
    architecture = (REPO / "ARCHITECTURE.md").read_text()
    named = set(
        re.findall(r"`((?:qa_core|train|export|server|harness|clients|bench|tests)/[\w/.]*)`", architecture)
    )
    missing = sorted(p for p in named if not (REPO / p.rstrip("/")).exists())
    assert named and not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_test_an_invariant_cites_exists() -> None:
    """An invariant linked to its test names a test that is there (``tests/x.py::test_name``, or a bare
    ``test_name`` after one, in the same file)."""
    architecture = (REPO / "ARCHITECTURE.md").read_text()
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`((?:,\s*`\w+`)*)", architecture)
    assert cited
    for path, first, more in cited:
        defined = set(re.findall(r"^def (test_\w+)", (REPO / path).read_text(), re.M))
        for name in [first, *re.findall(r"`(\w+)`", more)]:
            assert name in defined, f"ARCHITECTURE.md cites {path}::{name}, which is not a test there"


def test_scikit_learn_is_imported_only_where_answerability_is_fitted() -> None:
    """ARCHITECTURE.md: scikit-learn lives in train/answerability/ and nowhere else in the product."""
    importers = []
    for room in ("qa_core", "train", "export", "server", "harness", "clients", "bench"):
        for path in sorted((REPO / room).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n == "sklearn" or n.startswith("sklearn.") for n in names):
                    importers.append(path.relative_to(REPO).as_posix())
    outside = sorted({p for p in importers if not p.startswith("train/answerability/")})
    assert importers and not outside, f"scikit-learn imported outside train/answerability/: {outside}"


def test_the_engine_process_loads_no_http_framework() -> None:
    """What the contract says statically, at run time: the engine's entry point, imported in a fresh
    interpreter, has loaded neither FastAPI nor the HTTP server and its parser."""
    code = (
        "import sys, server.topology.engine.__main__, server.topology.engine.service\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'httptools', 'server.app', 'server.api.routes') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
