"""What the deployment kit's tests share: where the kit is, the validators' command-line tools, and the
server facts (settings, routes) each file is checked against."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import REPO

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILES = {"cpu": DEPLOY / "Dockerfile", "gpu": DEPLOY / "Dockerfile.gpu"}
# Kubernetes releases the manifests must be valid for: an older supported one and the newest vendored.
K8S_VERSIONS = ("1.29", "latest")
ENV_NAME = re.compile(r"\bXLNETQA_[A-Z0-9_]+\b")


def tool(name: str) -> str:
    """A command-line tool installed by pyproject's test-tools extra (next to this Python, else on PATH)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: pip install -e '.[test-tools]'")
    return found


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)


def settings_fields() -> set[str]:
    from server.settings import ServerSettings

    return set(ServerSettings.model_fields)


def check_settings(env: dict[str, str], where: str) -> Any:
    """XLNETQA_* names are real settings fields and their values pass ServerSettings' validation."""
    from server.settings import ENV_PREFIX, ServerSettings

    unknown = sorted(k for k in env if k[len(ENV_PREFIX) :].lower() not in settings_fields())
    assert not unknown, f"{where}: not server settings: {unknown}"
    return ServerSettings(**{k[len(ENV_PREFIX) :].lower(): v for k, v in env.items()})


def app_paths() -> set[str]:
    """Every route path of the server's app (the same routers server.app.create_app includes)."""
    from server.api.routes import answer_router, batch_router, ops_router

    return {r.path for router in (answer_router, ops_router, batch_router(1)) for r in router.routes}


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def cpu_quantity(value: str | int) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def dockerfile_stages(path: Path) -> list[dict[str, Any]]:
    """Instructions per build stage: continuation lines joined, comments and blank lines dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#"):
            continue  # comments, parser directives, and comments inside a continued instruction
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line:
            lines.append(line)
    stages: list[dict[str, Any]] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM, which FROM lines may use
    for line in lines:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            parts = re.split(r"\s+as\s+", args, flags=re.I)
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m[1]], parts[0])
            stages.append({"from": image, "name": parts[1] if len(parts) > 1 else None, "ins": []})
        elif stages:
            stages[-1]["ins"].append((keyword, args))
        elif keyword == "ARG":
            name, _, default = args.partition("=")
            global_args[name] = default
    return stages


def dockerfile_env(stage: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in stage["ins"]:
        if keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env


def k8s_documents(directory: Path) -> dict[str, dict[str, Any]]:
    """Resources of one kustomization, by kind (each kind once), after checking the kustomization lists
    exactly the manifests in its directory."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present, f"kustomization.yaml resources {sorted(listed)} != files {sorted(present)}"
    docs = [d for name in sorted(listed) for d in load_yaml_docs(directory / name)]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs)
    return by_kind


@pytest.fixture(autouse=True)
def no_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """ServerSettings reads XLNETQA_* from the environment: only the files under test may set them
    (autouse in every module that imports it)."""
    for name in list(os.environ):
        if name.startswith("XLNETQA_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)


def copied_sources(dockerfile: Path) -> set[str]:
    """What the builder stage of ``dockerfile`` copies from the build context."""
    return {
        source
        for keyword, args in dockerfile_stages(dockerfile)[0]["ins"]
        if keyword == "COPY"
        for source in args.split()[:-1]
        if not source.startswith("--")
    }


# What the CPU image carries of the repository's packages: the serving core, the server, the schema.
SERVER_IMAGE_PACKAGES = ("qa_core", "server", "clients")
