"""The study scripts under docs/ (run.sh calls them to reproduce a study's tables at HEAD) import at
HEAD: a module the code moved out from under one fails here, not on the day someone reruns the study."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest
from paths import REPO

SCRIPTS = sorted(
    subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "docs/**/*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
)


def test_there_are_study_scripts() -> None:
    assert len(SCRIPTS) >= 10 and "docs/study/reader-v3/ship.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_study_script_imports_at_head(script: str) -> None:
    spec = importlib.util.spec_from_file_location(f"study_{abs(hash(script))}", REPO / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # each keeps its work behind `if __name__ == "__main__"`
    assert callable(getattr(module, "main", None)), f"{script} has no main()"
