"""The HTTP API's reference page (docs/api.md), generated from the OpenAPI schema the server serves:
``python -m server.api_reference > docs/api.md``. A test compares the committed page with a fresh
generation, so the reference never drifts from the routes and the bodies (``clients/schema.py``).

Every route with its method, what it does, its request body's fields (type, required or default,
bounds, meaning), its responses by status with the error kinds, and the bodies it answers with. A
page of plain Markdown, so it reads the same on the documentation site, on GitHub and offline.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI

from server.routes import answer_router, batch_router, ops_router
from server.settings import ServerSettings

Schema = dict[str, Any]


def openapi_schema() -> Schema:
    """The schema of the server's routes with the default settings (no model needed to build it)."""
    app = FastAPI(title="XLNet QA", version="1.0")
    app.include_router(answer_router)
    app.include_router(batch_router(ServerSettings.model_fields["max_batch_items"].default))
    app.include_router(ops_router)
    return app.openapi()


def _resolve(schema: Schema, node: Schema) -> Schema:
    ref = node.get("$ref")
    return schema["components"]["schemas"][ref.rsplit("/", 1)[-1]] if ref else node


def _type(schema: Schema, node: Schema) -> str:
    """A field's type, readably: ``integer``, ``string or null``, ``list of NBestEntry``, ``AnswerRequest``."""
    if "$ref" in node:
        return f"[{node['$ref'].rsplit('/', 1)[-1]}](#{node['$ref'].rsplit('/', 1)[-1].lower()})"
    if "anyOf" in node:
        return " or ".join(_type(schema, n) for n in node["anyOf"])
    if node.get("type") == "array":
        return "list of " + _type(schema, node.get("items", {}))
    if (
        node.get("type") == "object"
        and "additionalProperties" in node
        and isinstance(node["additionalProperties"], dict)
    ):
        return "object of " + _type(schema, node["additionalProperties"])
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


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("``", "`")


def fields_table(schema: Schema, body: Schema) -> list[str]:
    """One row per field of ``body``: name, type, required or default, bounds, meaning."""
    body = _resolve(schema, body)
    required = set(body.get("required", []))
    rows = ["| field | type | required / default | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
    for name, node in body.get("properties", {}).items():
        need = (
            "required"
            if name in required
            else f"default `{node['default']}`"
            if "default" in node
            else "optional"
        )
        rows.append(
            f"| `{name}` | {_type(schema, node)} | {need} | {_bounds(node)} | {_cell(node.get('description', ''))} |"
        )
    return rows


def _operation(schema: Schema, path: str, method: str, op: Schema) -> list[str]:
    lines = [f"## {method.upper()} {path}", "", _cell(op.get("description") or op.get("summary", "")), ""]
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body is not None:
        name = body["$ref"].rsplit("/", 1)[-1] if "$ref" in body else "body"
        lines += [f"Request body ([{name}](#{name.lower()}), JSON):", "", *fields_table(schema, body), ""]
    lines += ["| status | when | body |", "| --- | --- | --- |"]
    for status, response in op.get("responses", {}).items():
        content = response.get("content", {})
        json_schema = content.get("application/json", {}).get("schema")
        kind = (
            f"[{json_schema['$ref'].rsplit('/', 1)[-1]}](#{json_schema['$ref'].rsplit('/', 1)[-1].lower()})"
            if json_schema and "$ref" in json_schema
            else ", ".join(content) or "-"
        )
        lines.append(f"| {status} | {_cell(response.get('description', ''))} | {kind} |")
    return [*lines, ""]


def markdown(schema: Schema | None = None) -> str:
    """The reference page (see the module docstring)."""
    schema = schema or openapi_schema()
    lines = [
        "# HTTP API reference",
        "",
        "Generated from the server's OpenAPI schema (`python -m server.api_reference > docs/api.md`; a test",
        "keeps this page equal to a fresh generation). Every route needs an API key when the server has",
        "keys (`Authorization: Bearer <key>` or `X-API-Key: <key>`), except the probes `/healthz` and",
        "`/readyz`; every error is JSON `{error, message, request_id}` with the kinds listed in",
        "[Serving](serving.md). Limits that depend on the server's settings (characters, windows, batch",
        "items) are answered with 413 naming the setting; `GET /v1/model` reports them.",
        "",
    ]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            lines += _operation(schema, path, method, op)
    lines += ["# Bodies", ""]
    for name, body in schema["components"]["schemas"].items():
        lines += [f"## {name}", "", _cell(body.get("description", "")), "", *fields_table(schema, body), ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
