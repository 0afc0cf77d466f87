"""The documentation runs as written: every ``bash`` and ``python`` block of README.md, then of the site's
pages under ``docs/`` in the order of ``mkdocs.yml``'s nav, in order, on the shipped sample.

The blocks run in a copy of the repository's files (``git ls-files``: tracked, and untracked but not
ignored, so the working tree is what runs) with this interpreter's directory first on ``PATH``, as
``source .venv/bin/activate`` puts it. A bash block runs with ``bash -e -o pipefail``, a python block
as ``python -``. A block fails the test with its text and its output when it exits non-zero.

Skipped: a block whose fence follows the line ``<!-- readme-test: skip (why) -->`` (the reason is
required; a marker anywhere else is an error), and fences that are not ``bash`` or ``python`` (the
layout, tables of output). A page that repeats a block of the README's tour says so with the reason
``the tour in README.md runs this block``, and the block must then be that block, to the letter.

Servers: a bash block that starts ``python -m server`` (that one command, with ``--port``) runs in the
background; the test waits for its ``/readyz`` (over https when it has ``--ssl-certfile``), runs the
next blocks against it and stops it (SIGTERM to its process group) at the end.

Rewrites, the only differences from the text, so that the README costs minutes rather than hours:

- steps: ``--steps``, ``--pretrain-steps``, ``--synth-steps`` and ``--finetune-steps`` N become 2,
  ``--stop-after`` N becomes 1;
- grids: the list flags of the experiment commands (``--runs``, ``--configs``, ``--seeds``,
  ``--max-seq-lens``, ``--freeze-layers``, ``--heads``) keep their first value: one cell, one run;
- model size: ``--config small`` and ``--preset small`` become ``tiny``;
- ports: a port after ``--port``, ``localhost:`` or ``127.0.0.1:`` becomes a free port, the same one
  for every mention of that port, so a server left on 8000 or a parallel run does not collide.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from paths import REPO

from harness.server_process import free_port
from server.settings import ENV_PREFIX

README = REPO / "README.md"
TOUR_REASON = "the tour in README.md runs this block"
RUNNABLE = ("bash", "python")
SKIP = re.compile(r"^\s*<!-- readme-test: skip \((?P<why>[^)]+)\) -->\s*$")
MARKER = re.compile(r"^\s*<!--\s*readme-test")  # a marker line (the Testing section quotes one inline)
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\S*)")
BLOCK_TIMEOUT_S = 600
READY_TIMEOUT_S = 120

REWRITES = [
    (re.compile(r"(--(?:pretrain-|synth-|finetune-)?steps)([ =])\d+"), r"\g<1>\g<2>2"),
    (re.compile(r"(--stop-after)([ =])\d+"), r"\g<1>\g<2>1"),
    (
        re.compile(r"(--(?:runs|configs|seeds|max-seq-lens|freeze-layers|heads))([ =])([^,\s]+),\S+"),
        r"\g<1>\g<2>\g<3>",
    ),
    (re.compile(r"(--(?:config|preset))([ =])small\b"), r"\g<1>\g<2>tiny"),
]
PORT = re.compile(r"(--port[ =]|localhost:|127\.0\.0\.1:)(\d{2,5})\b")


def documents() -> list[str]:
    """README.md, then the site's pages under docs/ in the order of mkdocs.yml's nav (repository paths)."""

    def flatten(nav: list) -> list[str]:
        out: list[str] = []
        for entry in nav:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            out += flatten(value) if isinstance(value, list) else [value]
        return out

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    pages = [f"docs/{uri}" for uri in flatten(nav) if (REPO / "docs" / uri).is_file()]
    return ["README.md", *pages]


@dataclass
class Block:
    where: str  # document:line of its opening fence, 1-based
    lang: str
    text: str
    skip: str | None  # the marker's reason

    @property
    def starts_server(self) -> bool:
        return (
            self.lang == "bash"
            and re.match(r"python -m server\b(?!.*--help)", self.text.lstrip()) is not None
        )


def read_blocks(document: str = "README.md", root: Path = REPO) -> list[Block]:
    """The fenced blocks of ``root/document`` in order, each with the skip reason on the line before it."""
    lines = (root / document).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            if MARKER.search(lines[i]) and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                raise AssertionError(
                    f"{document}:{i + 1}: a readme-test marker must sit right before a fence"
                )
            i += 1
            continue
        indent, lang, start = fence["indent"], fence["lang"], i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        previous = lines[start - 1] if start > 0 else ""
        skip = SKIP.match(previous)
        if MARKER.search(previous) and (skip is None or lang not in RUNNABLE):
            raise AssertionError(
                f"{document}:{start}: write '<!-- readme-test: skip (why) -->' before a bash or python block"
            )
        text = "\n".join(body) + "\n"
        blocks.append(Block(f"{document}:{start + 1}", lang, text, skip["why"] if skip else None))
    return blocks


def rewrite(text: str, ports: dict[str, int]) -> str:
    """The block as the test runs it (the module docstring lists the rules)."""
    for pattern, replacement in REWRITES:
        text = pattern.sub(replacement, text)

    def port(m: re.Match[str]) -> str:
        if m[2] not in ports:
            ports[m[2]] = free_port()
        return m[1] + str(ports[m[2]])

    return PORT.sub(port, text)


def copy_repository(dest: Path) -> None:
    """The working tree's files that git would ship (no runs/, no .venv)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if src.is_file():  # a deleted but still tracked file is not in the working tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def activated_env(root: Path) -> dict[str, str]:
    """This environment as an activated venv gives it, running the copy's code, no XLNETQA_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = sys.prefix
    env["PYTHONPATH"] = str(root)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Servers:
    """The README's servers, in the background until the end of the test."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        self.running: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, block: Block, text: str) -> None:
        commands = [ln for ln in text.replace("\\\n", " ").splitlines() if ln.strip()]
        port = re.search(r"--port[ =](\d+)", text)
        assert len(commands) == 1 and port, f"{block.where}: a server block holds one command with --port"
        log = self.root / f"server-{block.where.replace('/', '-')}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", text],
                cwd=self.root,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.running.append((proc, log))
        scheme = "https" if "--ssl-certfile" in text else "http"
        url = f"{scheme}://127.0.0.1:{port[1]}/readyz"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                fail(block, text, f"exited {proc.returncode}", log.read_text(errors="replace"))
            try:
                if httpx.get(url, timeout=2.0, verify=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        fail(block, text, f"not ready after {READY_TIMEOUT_S} s", log.read_text(errors="replace"))

    def stop(self) -> None:
        for proc, _ in self.running:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.running:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def fail(block: Block, text: str, what: str, output: str) -> None:
    pytest.fail(
        f"{block.where}: this {block.lang} block {what}:\n{text}\n--- its output (last 6000 characters) ---\n"
        f"{output[-6000:]}",
        pytrace=False,
    )


def run_block(block: Block, text: str, root: Path, env: dict[str, str]) -> str:
    """Run one foreground block; its output, or the test fails with it."""
    cmd = ["bash", "-e", "-o", "pipefail", "-c", text] if block.lang == "bash" else ["python", "-"]
    try:
        r = subprocess.run(
            cmd,
            cwd=root,
            env=env,
            input=text if block.lang == "python" else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=BLOCK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        fail(block, text, f"ran past {BLOCK_TIMEOUT_S} s", str(exc.output or ""))
    if r.returncode != 0:
        fail(block, text, f"exited {r.returncode}", r.stdout)
    return r.stdout


def test_markers_are_well_formed_and_the_runnable_blocks_cover_the_product() -> None:
    """Every marker sits before a runnable fence with a reason, a page's copy of a tour block is that block,
    and what runs reaches every stage."""
    tour = [b.text for b in read_blocks() if b.lang in RUNNABLE and b.skip is None]
    blocks = [b for document in documents() for b in read_blocks(document)]
    copies = [b for b in blocks if b.skip == TOUR_REASON]
    assert copies and all(b.text in tour for b in copies), [b.where for b in copies if b.text not in tour]
    runnable = [b for b in blocks if b.lang in RUNNABLE and b.skip is None]
    joined = "\n".join(b.text for b in runnable)
    for command in ("train.tokenizer", "train.pretrain", "train.finetune", "train.evaluate", "export.onnx"):
        assert f"python -m {command} " in joined, command
    assert sum(b.starts_server for b in runnable) >= 2 and "XLNetQAClient" in joined
    assert all(b.skip.strip() for b in blocks if b.skip is not None)


@pytest.mark.timeout(1200)
def test_readme_runs_as_written(tmp_path: Path) -> None:
    root = tmp_path / "xlnet-qa"
    copy_repository(root)
    env = activated_env(root)
    servers = Servers(root, env)
    ports: dict[str, int] = {}
    ran, skipped = [], []
    try:
        for document in documents():
            for block in read_blocks(document, root):
                if block.lang not in RUNNABLE:
                    continue
                if block.skip is not None:
                    skipped.append(f"{block.where} ({block.skip})")
                    continue
                text = rewrite(block.text, ports)
                t = time.monotonic()
                if block.starts_server:
                    servers.start(block, text)
                else:
                    run_block(block, text, root, env)
                ran.append(f"{block.where} {time.monotonic() - t:.0f} s")
    finally:
        servers.stop()
    print("ran:", *ran, "skipped:", *skipped, sep="\n  ")
    assert ran
