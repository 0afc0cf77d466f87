"""A command of the product run as its users run it: ``python -m MODULE ARGS`` from the repository root."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from paths import REPO


def run_module(
    module: str, *args: str | Path, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` in the repository (in ``env``, else this process's environment),
    stdout and stderr captured as text."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
