"""MkDocs hooks: the site shows the repository's root documents, and its links work on the site as they
do on GitHub.

The README is the site's home page, and ARCHITECTURE.md and BENCHMARKS.md are pages of it, read from
the root (one copy of each). Markdown links are written for the repository (a docs page links
``../ARCHITECTURE.md`` or ``../bench/latency.py``, the README ``docs/serving.md``); each is resolved
against the file's place in the repository and rewritten to the page or file of the site that holds
it. A link to a source file is a link into ``repo_url`` when the site has one, else its text alone;
a link to a path that does not exist is a warning, which fails the strict build.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parents[1]
DOCS = "docs"
ROOT_PAGES = {"README.md": "index.md", "ARCHITECTURE.md": "architecture.md", "BENCHMARKS.md": "benchmarks.md"}
LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")
log = logging.getLogger("mkdocs.plugins.xlnetqa")


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    for source, uri in ROOT_PAGES.items():
        files.append(File.generated(config, uri, abs_src_path=str(REPO / source)))
    return files


def repository_path(page: Page) -> str:
    """Where the page's Markdown lives in the repository."""
    uri = page.file.src_uri
    by_site = {site: root for root, site in ROOT_PAGES.items()}
    return by_site.get(uri, posixpath.join(DOCS, uri))


def site_target(target: str, source: str, config: MkDocsConfig) -> str | None:
    """The link ``target`` written in repository file ``source`` as the site resolves it from that
    page (None: not a path of this repository)."""
    path, _, anchor = target.partition("#")
    if not path:
        return target
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if resolved.startswith("../") or not (REPO / resolved).exists():
        return None
    here = posixpath.dirname(ROOT_PAGES.get(source, source.removeprefix(DOCS + "/")))
    if resolved in ROOT_PAGES:
        site = ROOT_PAGES[resolved]
    elif resolved.startswith(DOCS + "/") and (REPO / resolved).is_file():
        site = resolved.removeprefix(DOCS + "/")
    else:  # a source file, or a folder: not a page of the site
        if not config.repo_url:
            return ""
        kind = "tree" if (REPO / resolved).is_dir() else "blob"
        return f"{config.repo_url.rstrip('/')}/{kind}/main/{resolved}" + (f"#{anchor}" if anchor else "")
    relative = posixpath.relpath(site, here or ".")
    return relative + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    source = repository_path(page)

    def rewrite(m: re.Match[str]) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            return m.group(0)  # a URL or an absolute path: the site's own rules apply
        site = site_target(target, source, config)
        if site is None:
            log.warning("%s links to %r, which is not in the repository", source, target)
            return m.group(0)
        if site == "":
            return label[1:-1] if not label.startswith("!") else m.group(0)
        return f"{label}({site})"

    chunks, prose, in_fence = [], [], False  # links are rewritten in prose only (a label may wrap)
    for line in markdown.split("\n"):
        if FENCE.match(line):
            if not in_fence and prose:
                chunks.append(LINK.sub(rewrite, "\n".join(prose)))
                prose = []
            chunks.append(line)
            in_fence = not in_fence
        elif in_fence:
            chunks.append(line)
        else:
            prose.append(line)
    if prose:
        chunks.append(LINK.sub(rewrite, "\n".join(prose)))
    return "\n".join(chunks)
