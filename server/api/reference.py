"""The HTTP API's reference, generated from the OpenAPI schema the server serves, in two renderings of
one page: Markdown for docs/api.md (``python -m server.api.reference > docs/api.md``; a test compares
the committed page with a fresh generation, so it never drifts from the routes and the bodies in
``clients/schema.py``) and self-contained HTML for the server's own ``GET /docs`` (no script, no
stylesheet or font from a CDN: it renders with the network off, where Swagger UI's page was blank).

Every route with its method, what it does, its request body's fields (type, required or default,
bounds, meaning), its responses by status, and the bodies it answers with.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI

Schema = dict[str, Any]


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str  # inline markup: `code` and [text](#anchor)


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


Block = Heading | Paragraph | Table

INTRO = (
    "Generated from the server's OpenAPI schema (`python -m server.api.reference > docs/api.md`; a test keeps "
    "this page equal to a fresh generation; a running server shows the same page at `GET /docs`). Every route "
    "needs an API key when the server has keys (`Authorization: Bearer <key>` or `X-API-Key: <key>`), except "
    "the probes `/healthz` and `/readyz`; every error is JSON `{error, message, request_id}` with the kinds "
    "listed in [Observability](observability.md). Limits that depend on the server's settings (characters, windows, batch "
    "items) are answered with 413 naming the setting; `GET /v1/model` reports them."
)


def openapi_schema() -> Schema:
    """The schema of the server's routes with the default settings (no model needed to build it)."""
    from server.api.routes import answer_router, batch_router, ops_router
    from server.settings import ServerSettings

    app = FastAPI(title="XLNet QA", version="1.0")
    app.include_router(answer_router)
    app.include_router(batch_router(ServerSettings.model_fields["max_batch_items"].default))
    app.include_router(ops_router)
    return app.openapi()


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _link(ref: str) -> str:
    return f"[{_name(ref)}](#{_name(ref).lower()})"


def _resolve(schema: Schema, node: Schema) -> Schema:
    ref = node.get("$ref")
    return schema["components"]["schemas"][_name(ref)] if ref else node


def _type(node: Schema) -> str:
    """A field's type, readably: ``integer``, ``string or null``, ``list of NBestEntry``."""
    if "$ref" in node:
        return _link(node["$ref"])
    if "anyOf" in node:
        return " or ".join(_type(n) for n in node["anyOf"])
    if node.get("type") == "array":
        return "list of " + _type(node.get("items", {}))
    extra = node.get("additionalProperties")
    if node.get("type") == "object" and isinstance(extra, dict):
        return "object of " + _type(extra)
    return str(node.get("type", "any"))


def _bounds(node: Schema) -> str:
    """``1 to 20``, ``at most 32 items``, from the field (or its non-null alternative)."""
    for candidate in [node, *node.get("anyOf", [])]:
        parts = []
        low, high = candidate.get("minimum"), candidate.get("maximum")
        if low is not None and high is not None:
            parts.append(f"{low:g} to {high:g}")
        elif low is not None:
            parts.append(f"at least {low:g}")
        elif high is not None:
            parts.append(f"at most {high:g}")
        if "maxItems" in candidate:
            parts.append(f"at most {candidate['maxItems']} items")
        if "minItems" in candidate:
            parts.append(f"at least {candidate['minItems']} item(s)")
        if candidate.get("minLength"):
            parts.append("not empty")
        if parts:
            return ", ".join(parts)
    return ""


def _text(text: str) -> str:
    return " ".join(text.split()).replace("``", "`")


def fields(schema: Schema, body: Schema) -> Table:
    """One row per field of ``body``: name, type, required or default, bounds, meaning."""
    body = _resolve(schema, body)
    required = set(body.get("required", []))
    rows = []
    for name, node in body.get("properties", {}).items():
        need = (
            "required"
            if name in required
            else f"default `{node['default']}`"
            if "default" in node
            else "optional"
        )
        rows.append((f"`{name}`", _type(node), need, _bounds(node), _text(node.get("description", ""))))
    return Table(("field", "type", "required / default", "bounds", "meaning"), tuple(rows))


def _operation(schema: Schema, path: str, method: str, op: Schema) -> list[Block]:
    blocks: list[Block] = [
        Heading(2, f"{method.upper()} {path}"),
        Paragraph(_text(op.get("description") or op.get("summary", ""))),
    ]
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body is not None:
        named = _link(body["$ref"]) if "$ref" in body else "body"
        blocks += [Paragraph(f"Request body ({named}, JSON):"), fields(schema, body)]
    rows = []
    for status, response in op.get("responses", {}).items():
        content = response.get("content", {})
        json_schema = content.get("application/json", {}).get("schema")
        kind = (
            _link(json_schema["$ref"]) if json_schema and "$ref" in json_schema else ", ".join(content) or "-"
        )
        rows.append((str(status), _text(response.get("description", "")), kind))
    return [*blocks, Table(("status", "when", "body"), tuple(rows))]


def blocks(schema: Schema | None = None) -> list[Block]:
    """The page, rendering-neutral."""
    schema = schema or openapi_schema()
    page: list[Block] = [Heading(1, "HTTP API reference"), Paragraph(INTRO)]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            page += _operation(schema, path, method, op)
    page.append(Heading(1, "Bodies"))
    for name, body in schema["components"]["schemas"].items():
        page += [Heading(2, name), Paragraph(_text(body.get("description", ""))), fields(schema, body)]
    return page


def markdown(schema: Schema | None = None) -> str:
    """The page as Markdown (docs/api.md)."""
    out: list[str] = []
    for block in blocks(schema):
        if isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        else:
            cell = lambda text: text.replace("|", "\\|")  # noqa: E731 - a table cell's one escape
            out.append("| " + " | ".join(block.header) + " |")
            out.append("| " + " | ".join("---" for _ in block.header) + " |")
            out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in block.rows]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\((#[\w-]+|[\w.-]+\.md)\)")
_STYLE = (
    "body{font:15px/1.5 system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "table{border-collapse:collapse;margin:.5rem 0 1.5rem}td,th{border:1px solid #ccc;padding:.25rem .5rem;"
    "text-align:left;vertical-align:top}code{background:#f3f3f3;padding:0 .2rem}h2{margin-top:2rem}"
)


def _inline(text: str) -> str:
    """Inline markup as HTML: code spans, and links (to an anchor of this page; a page of the docs is
    named, not linked, since the server does not serve the docs site)."""
    escaped = html.escape(text, quote=False)
    escaped = _CODE.sub(lambda m: f"<code>{m[1]}</code>", escaped)
    return _LINK.sub(lambda m: f'<a href="{m[2]}">{m[1]}</a>' if m[2].startswith("#") else m[1], escaped)


def page_html(schema: Schema) -> str:
    """The page as one self-contained HTML document (``GET /docs``): inline style, no script."""
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', "<title>XLNet QA: HTTP API</title>",
           f"<style>{_STYLE}</style></head><body>"]  # fmt: skip
    for block in blocks(schema):
        if isinstance(block, Heading):
            anchor = block.text.lower() if block.level == 2 and " " not in block.text else ""
            attr = f' id="{html.escape(anchor)}"' if anchor else ""
            out.append(f"<h{block.level}{attr}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{_inline(block.text)}</p>")
        else:
            head = "".join(f"<th>{_inline(h)}</th>" for h in block.header)
            body = "".join(
                "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in block.rows
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "\n".join([*out, "</body></html>"]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m server.api.reference",
        description="Write the HTTP API reference generated from the server's OpenAPI schema "
        "(docs/api.md is its Markdown rendering; GET /docs serves the HTML one).",
    )
    parser.add_argument("--format", choices=("markdown", "html"), default="markdown", help="Rendering")
    parser.add_argument("--out", type=Path, default=None, help="File to write (default: standard output)")
    args = parser.parse_args(argv)
    text = markdown() if args.format == "markdown" else page_html(openapi_schema())
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
