"""The import contracts (pyproject.toml, `lint-imports`) hold what ARCHITECTURE.md's layer table says: the
server's is an allow-list (its forbidden list is exactly every package the table does not let it import),
and a copy of the code with one forbidden import per row of the table fails `lint-imports`, each import
named in the report."""

from __future__ import annotations

import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from paths import REPO

PACKAGES = ("qa_core", "train", "export", "server", "clients", "bench", "harness")
SERVER_CONTRACT = "the server imports only what the table allows"


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def children(package: str) -> set[str]:
    return {m.name for m in pkgutil.iter_modules([str(REPO / package.replace(".", "/"))], package + ".")}


def server_may_import() -> set[str]:
    """What ARCHITECTURE.md's server row lets it import of export/ (train.model only in the torch backend,
    by the contract's ignore_imports): the row is the allow-list, the contract its complement."""
    architecture = (REPO / "ARCHITECTURE.md").read_text()
    row = next(line for line in architecture.splitlines() if line.startswith("| `server/` |"))
    assert "`qa_core`" in row and "`train.model` in the torch backend only" in row, row
    return set(re.findall(r"`(export\.[\w.]+)`", row))


def test_the_server_contract_is_an_allow_list_of_the_table() -> None:
    contract = next(c for c in contracts() if c["name"].startswith(SERVER_CONTRACT))
    everything = (children("train") | children("export") | children("export.trt")) - {"export.trt"}
    allowed = {m for m in everything if any(m == a or m.startswith(a + ".") for a in server_may_import())}
    assert allowed == server_may_import()  # the row names modules that exist
    assert set(contract["forbidden_modules"]) == everything - allowed
    assert all(
        ignored.startswith("server.backends.torch -> train.model.") for ignored in contract["ignore_imports"]
    )


# One forbidden import per row of the table and per other contract: (the file it is added to, the import,
# the module it reaches).
VIOLATIONS = [
    ("harness/tiny_models.py", "import bench.common", "harness.tiny_models -> bench.common"),  # harness row
    (
        "server/answering/batching.py",
        "import train.engine.loop",
        "server.answering.batching -> train.engine.loop",
    ),  # server row
    (
        "server/limits/quotas.py",
        "import export.onnx.graph",
        "server.limits.quotas -> export.onnx.graph",
    ),  # server row
    (
        "server/answering/batching.py",
        "import train.squad.metrics",
        "server.answering.batching -> train.squad.metrics",
    ),  # server row
    (
        "server/door/auth.py",
        "import torch",
        "server.door.auth -> torch",
    ),  # server row: torch in its backend only
    ("export/onnx/graph.py", "import server.settings", "export.onnx.graph -> server.settings"),  # export row
    (
        "qa_core/runtime/runner.py",
        "import train.engine.loop",
        "qa_core.runtime.runner -> train.engine.loop",
    ),  # core
    ("qa_core/squad/decode.py", "import torch", "qa_core.squad.decode -> torch"),  # core row: torch-free
    ("qa_core/contract.py", "import fastapi", "qa_core.contract -> fastapi"),  # core row: no web framework
    ("train/model/layers.py", "import clients.schema", "train.model.layers -> clients.schema"),  # train row
    # the other contracts, one each
    ("train/squad/metrics.py", "import torch", "train.squad.metrics -> torch"),  # torch-free training core
    ("export/triton/pbtxt.py", "import torch", "export.triton.pbtxt -> torch"),  # TensorRT/Triton torch-free
    ("server/limits/breaker.py", "import sklearn", "server.limits.breaker -> sklearn"),  # no scikit-learn
    ("train/engine/loop.py", "import train.recipes.presets", "train.engine.loop -> train.recipes.presets"),
    ("harness/server_process.py", "import train.finetune", "harness.server_process -> train.finetune"),
    ("train/data/config.py", "import train.engine.state", "train.data.config -> train.engine.state"),
    ("server/topology/engine/wire.py", "import fastapi", "server.topology.engine.wire -> fastapi"),
    (
        "clients/client.py",
        "import qa_core.contract",
        "clients.client -> qa_core.contract",
    ),  # the SDK
]


@pytest.fixture(scope="module")
def broken_copy(tmp_path_factory: pytest.TempPathFactory) -> str:
    copy = tmp_path_factory.mktemp("contracts")
    for package in PACKAGES:
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    for path, line, _ in VIOLATIONS:
        target = copy / path
        assert target.is_file(), path
        target.write_text(target.read_text() + f"\n{line}  # injected by tests/test_import_contracts.py\n")
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint), "--config", "pyproject.toml", "--no-cache"],
        cwd=copy,
        env={"PATH": str(lint.parent), "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout[-3000:]
    return proc.stdout


def test_every_contract_has_a_forbidden_import_here() -> None:
    """Each contract of pyproject.toml is broken by at least one import above (none is untested)."""
    broken = {chain.split(" -> ")[0] for _, _, chain in VIOLATIONS}
    for contract in contracts():
        sources = contract.get("source_modules") or contract.get("layers") or []
        assert any(b == s or b.startswith(s + ".") for b in broken for s in sources), contract["name"]


@pytest.mark.parametrize(("path", "line", "chain"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_a_forbidden_import_in_each_row_fails_lint_imports(
    broken_copy: str, path: str, line: str, chain: str
) -> None:
    assert chain in broken_copy, broken_copy[-3000:]


def test_the_real_tree_keeps_every_contract() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and " 0 broken" in proc.stdout, proc.stdout[-3000:]
