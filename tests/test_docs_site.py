"""The documentation site builds strictly from the tree, and a page that links to a file or an anchor that
is not there fails the build (what `make docs` runs in CI), whichever page holds the link. Not with
``--quiet``: mkdocs then drops its warnings before strict mode counts them, and the build passes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO

ROOT_DOCUMENTS = ("mkdocs.yml", "README.md", "ARCHITECTURE.md", "BENCHMARKS.md")


def site_copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    for name in ROOT_DOCUMENTS:
        shutil.copy2(REPO / name, root / name)
    for folder in (
        "bench",
        "qa_core",
        "train",
        "export",
        "server",
        "clients",
        "deploy",
        "models",
        "data",
        "tests",
    ):
        (root / folder).symlink_to(REPO / folder)  # what the pages link to outside docs/
    for name in ("Makefile", "pyproject.toml", "CHANGELOG.md", "demo.py"):
        (root / name).symlink_to(REPO / name)
    return root


def build(root: Path) -> subprocess.CompletedProcess[str]:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    cmd = [str(mkdocs), "build", "--strict", "--site-dir", str(root / "site")]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    r = build(site_copy(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "repo" / "site" / "index.html").is_file()


@pytest.mark.parametrize(
    ("page", "link"),
    [
        ("docs/serving.md", "[gone](../bench/no_such_bench.py)"),  # a source file outside docs/
        ("docs/export.md", "[gone](serving.md#no-such-section)"),  # an anchor on another page
        ("README.md", "[gone](docs/no_such_page.md)"),  # the home page's own links
    ],
)
def test_a_link_to_nothing_fails_the_build(tmp_path: Path, page: str, link: str) -> None:
    root = site_copy(tmp_path)
    with open(root / page, "a", encoding="utf-8") as f:
        f.write(f"\n{link}\n")
    r = build(root)
    output = r.stdout + r.stderr
    target = link.split("(", 1)[1].rstrip(")")
    assert r.returncode != 0 and "Aborted with" in output and target in output, output


def test_the_http_api_reference_is_the_schema_as_generated_now() -> None:
    """docs/api.md is exactly what ``python -m server.api.reference`` writes from today's routes and
    bodies: a route, a field or an error status that changed without the page fails here."""
    from server.api.reference import markdown

    page = (REPO / "docs" / "api.md").read_text()
    assert page == markdown(), "docs/api.md is stale: python -m server.api.reference > docs/api.md"
    for route in ("## POST /answer", "## POST /answer/batch", "## GET /v1/model", "## GET /healthz"):
        assert route in page
