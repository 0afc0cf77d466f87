"""No import circles among the product's modules, type-only imports included: a circle through an
``if TYPE_CHECKING:`` import still says two modules know each other, and the next edit makes it a real
one. Read statically (every ``import`` and ``from ... import`` of every module), so it needs nothing
installed; a package's ``__init__`` re-exporting its own modules is not a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from paths import REPO

ROOTS = ("qa_core", "train", "export", "server", "clients", "harness", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product's modules that ``name`` imports (the deepest name that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            ancestor = name.startswith(target + ".")  # a module importing its own package: not a circle
            if target and target != name and not ancestor:
                out.add(target)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_type_only_imports_included() -> None:
    modules = all_modules()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    assert sum(len(v) for v in graph.values()) > 500  # the imports were read
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    """The finder itself: a type-only back edge is a circle."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
