"""The protobuf text-format subset Triton's config.pbtxt uses: write from dicts, parse back to dicts.

Values: str (quoted), int/float, bool, :class:`Enum` (bare identifier such as TYPE_INT64), dict (message
`name { ... }`), list of scalars (`dims: [ -1 ]`) and list of dicts (`input [ { ... }, { ... } ]`).
Parsing returns the same shapes (enums as plain str); a field repeated without brackets becomes a list.
"""

from __future__ import annotations

import re
from typing import Any


class Enum(str):
    """An enum value, written without quotes."""


def dumps(message: dict[str, Any], indent: int = 0) -> str:
    pad = "  " * indent
    lines: list[str] = []
    for key, value in message.items():
        if isinstance(value, dict):
            lines += [f"{pad}{key} {{", dumps(value, indent + 1).rstrip("\n"), f"{pad}}}"]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"{pad}{key} [")
            for i, item in enumerate(value):
                lines += [
                    f"{pad}  {{",
                    dumps(item, indent + 2).rstrip("\n"),
                    f"{pad}  }}" + ("," if i < len(value) - 1 else ""),
                ]
            lines.append(f"{pad}]")
        elif isinstance(value, list):
            inner = ", ".join(_scalar(v) for v in value)
            lines.append(f"{pad}{key}: [ {inner} ]" if inner else f"{pad}{key}: [ ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return "\n".join(line for line in lines if line) + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"cannot write {type(value).__name__} in pbtxt")


_TOKEN = re.compile(
    r'\s*(?:(#[^\n]*)|("(?:\\.|[^"\\])*")|([{}\[\]:,])|([-+]?[0-9][0-9.eE+-]*)|([A-Za-z_][A-Za-z0-9_.]*))'
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"pbtxt: cannot parse at character {pos}: {text[pos : pos + 20]!r}")
        pos = m.end()
        comment, string, punct, number, ident = m.groups()
        if comment:
            continue
        if string is not None:
            out.append(("str", bytes(string[1:-1], "utf-8").decode("unicode_escape")))
        elif punct:
            out.append(("punct", punct))
        elif number is not None:
            out.append(("num", number))
        elif ident is not None:
            out.append(("ident", ident))
    return out


def loads(text: str) -> dict[str, Any]:
    """Parse config.pbtxt text into nested dicts and lists."""
    tokens = _tokens(text)
    message, pos = _message(tokens, 0, closing=None)
    if pos != len(tokens):
        raise ValueError(f"pbtxt: unexpected {tokens[pos][1]!r}")
    return message


def _message(tokens, pos: int, closing: str | None) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while pos < len(tokens) and tokens[pos] != ("punct", closing):
        kind, key = tokens[pos]
        if kind != "ident":
            raise ValueError(f"pbtxt: expected a field name, got {key!r}")
        pos += 1
        if tokens[pos] == ("punct", ":"):
            pos += 1
        value, pos = _value(tokens, pos)
        if tokens[pos : pos + 1] == [("punct", ",")]:
            pos += 1
        if key in out:  # repeated field written as separate entries
            out[key] = (out[key] if isinstance(out[key], list) else [out[key]]) + (
                value if isinstance(value, list) else [value]
            )
        else:
            out[key] = value
    if closing is not None:
        pos += 1
    return out, pos


def _value(tokens, pos: int) -> tuple[Any, int]:
    kind, text = tokens[pos]
    if (kind, text) == ("punct", "{"):
        return _message(tokens, pos + 1, closing="}")
    if (kind, text) == ("punct", "["):
        items, pos = [], pos + 1
        while tokens[pos] != ("punct", "]"):
            item, pos = _value(tokens, pos)
            items.append(item)
            if tokens[pos] == ("punct", ","):
                pos += 1
        return items, pos + 1
    if kind == "num":
        return (float(text) if any(c in text for c in ".eE") else int(text)), pos + 1
    if kind == "ident" and text in ("true", "false"):
        return text == "true", pos + 1
    if kind in ("str", "ident"):
        return (Enum(text) if kind == "ident" else text), pos + 1
    raise ValueError(f"pbtxt: unexpected {text!r}")
