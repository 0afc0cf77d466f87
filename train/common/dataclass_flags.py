"""Command-line flags generated from a dataclass's fields, so that a command's options have one home.

A field that is a flag says so with :func:`flag`: its default, help text and anything argparse cannot
read from its type (choices, a parser for the value, a metavar, another spelling, a repeatable flag). A
switch that defaults off is ``--name``; one that defaults on is ``--name`` / ``--no-name``; a list field
takes one or more values (``--corpus a.txt b.txt``). :func:`add_flags` adds one flag per such field (``batch_size`` ->
``--batch-size``), its type, default and whether it is required read from the field;
:func:`options_from` builds the dataclass back from the parsed namespace. The server's flags come from
``ServerSettings`` the same way (:mod:`server.flags`), through pydantic's own field descriptions.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from qa_core.contract import HELP
from train.common.cli import Failure, OptionsCommand, Parser

T = TypeVar("T")
FLAG_KEY = "flag"


@dataclass(frozen=True)
class Flag:
    """How a field is spelled on the command line (what its type and default do not already say)."""

    help: str | None = None
    choices: Sequence[str] | None = None
    parse: Callable[[str], Any] | None = None  # the value's parser, for types argparse cannot read
    metavar: str | None = None
    name: str | None = None  # the flag, when it is not the field's name (``--verify-provider``)
    repeat: bool = False  # a tuple field: the flag may be given again, each value appended
    # A field holding another dataclass's values (a model's settings): one flag per field of ``nested``
    # (those named in ``nested_only``), each with that field's type and help (its metadata "help"). With
    # ``overrides`` the field is a dict of the values given (each flag defaults to None: "keep the
    # model's"); else it is a ``nested`` instance built from the flags' values.
    nested: type | None = None
    nested_only: tuple[str, ...] | None = None
    overrides: bool = False


def flag(default: Any = MISSING, *, default_factory: Any = MISSING, **spelling: Any) -> Any:
    """A dataclass field that is a command-line flag: ``opset: int = flag(17, help="ONNX opset")``."""
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={FLAG_KEY: Flag(**spelling)})
    return dataclasses.field(default=default, metadata={FLAG_KEY: Flag(**spelling)})


def flag_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are flags, in declaration order."""
    return [f for f in fields(cls) if FLAG_KEY in f.metadata]


def nested_fields(spec: Flag) -> list[dataclasses.Field]:
    """The fields of a nested flag's dataclass that are flags, in declaration order."""
    assert spec.nested is not None
    return [f for f in fields(spec.nested) if spec.nested_only is None or f.name in spec.nested_only]


def _nested_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    spec: Flag,
    names: Iterable[str] | None,
    defaults: dict[str, Any],
) -> None:
    """One flag per field of a nested dataclass (``--max-seq-len``), dest the field's name."""
    assert spec.nested is not None
    hints = typing.get_type_hints(spec.nested)
    chosen = nested_fields(spec)
    if names is not None:
        wanted = list(names)
        chosen = sorted((f for f in chosen if f.name in wanted), key=lambda f: wanted.index(f.name))
    for sub in chosen:
        text = sub.metadata.get(HELP, "")
        text += " (default: the model's)" if spec.overrides else ""
        default = None if spec.overrides else defaults.get(sub.name, sub.default)
        parser.add_argument(
            "--" + sub.name.replace("_", "-"),
            dest=sub.name,
            type=_value_type(hints[sub.name])[0],
            default=default,
            help=text.replace("%", "%%"),
        )


def _value_type(hint: Any) -> tuple[Any, bool]:
    """(the type of one value, whether the field holds a list): ``int | None`` -> (int, False),
    ``list[str] | None`` -> (str, True), ``tuple[str, ...]`` -> (str, False)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value_type(kinds[0]) if len(kinds) == 1 else (str, False)
    if typing.get_origin(hint) in (list, tuple):
        return _value_type(typing.get_args(hint)[0])[0], typing.get_origin(hint) is list
    return hint, False


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    only: Iterable[str] | None = None,
    defaults: dict[str, Any] | None = None,
    required: Iterable[str] = (),
    prefix: str = "",
    spell: dict[str, str] | None = None,
) -> None:
    """Add a flag for each flag field of ``cls`` (those named in ``only``, in that order; else all),
    its default the field's unless ``defaults`` names another; those named in ``required`` must be given.
    Another command that runs ``cls``'s recipe (an experiment) takes the same flags this way, with its own
    defaults: one type, one help text and one set of choices for each knob. A command that runs it more
    than once gives each run's flags a ``prefix`` (``--pretrain-steps``, dest ``pretrain_steps``);
    ``spell`` names a flag otherwise (``{"batch_size": "--pretrain-batch"}``, dest ``pretrain_batch``)."""
    must = set(required)
    by_name = {f.name: f for f in flag_fields(cls)}
    inside = {  # a nested field's own fields, by name: `only` may name them one by one
        sub.name: f
        for f in by_name.values()
        if f.metadata[FLAG_KEY].nested is not None
        for sub in nested_fields(f.metadata[FLAG_KEY])
    }
    hints = typing.get_type_hints(cls)
    for name in only if only is not None else list(by_name):
        if name in inside:
            _nested_flags(parser, inside[name].metadata[FLAG_KEY], [name], defaults or {})
            continue
        f = by_name[name]
        spec: Flag = f.metadata[FLAG_KEY]
        if spec.nested is not None:
            _nested_flags(parser, spec, None, defaults or {})
            continue
        dest = f"{prefix}_{name}" if prefix else name
        option = (spell or {}).get(name) or (None if prefix else spec.name) or "--" + dest.replace("_", "-")
        if spell and name in spell:
            dest = option.lstrip("-").replace("-", "_")
        default = (defaults or {}).get(name, f.default)
        if f.default_factory is not MISSING and name not in (defaults or {}):
            default = f.default_factory()
        kinds, many = _value_type(hints[name])
        text = spec.help.replace("%", "%%") if spec.help else spec.help  # argparse formats help with %
        kw: dict[str, Any] = {"dest": dest, "help": text}
        if kinds is bool:
            action = argparse.BooleanOptionalAction if default is True else "store_true"
            parser.add_argument(option, action=action, default=default, **kw)
            continue
        kw["type"] = spec.parse or (Path if kinds is Path else kinds)
        if spec.choices is not None:
            kw["choices"] = spec.choices
        if spec.metavar is not None:
            kw["metavar"] = spec.metavar
        if many:
            kw["nargs"] = "+"
        if default is MISSING or name in must:
            kw["required"] = True
        elif spec.repeat:
            kw |= {"action": "append", "default": list(default)}
        else:
            kw["default"] = default
        parser.add_argument(option, **kw)


def _default_of(f: dataclasses.Field) -> Any:
    factory = f.default_factory
    return factory() if callable(factory) else f.default


def nested_value(f: dataclasses.Field, values: Any) -> Any:
    """A nested flag field's value from an object holding its fields' values by name (parsed flags):
    the override dict of those given, or the field's default with them replaced."""
    spec: Flag = f.metadata[FLAG_KEY]
    given_here = {
        sub.name: getattr(values, sub.name) for sub in nested_fields(spec) if hasattr(values, sub.name)
    }
    if spec.overrides:
        return {k: v for k, v in given_here.items() if v is not None}
    return dataclasses.replace(_default_of(f), **given_here)


def split_nested(cls: type, settings: dict[str, Any]) -> dict[str, Any]:
    """``cls``'s keyword arguments from flat settings (``max_seq_len=128``): a nested flag field's own
    fields given by name go into its value (the field's default, those replaced)."""
    out = dict(settings)
    for f in flag_fields(cls):
        spec: Flag = f.metadata[FLAG_KEY]
        if spec.nested is None or spec.overrides or f.name in out:
            continue
        inner = {sub.name: out.pop(sub.name) for sub in nested_fields(spec) if sub.name in out}
        if inner:
            out[f.name] = dataclasses.replace(_default_of(f), **inner)
    return out


def flat_settings(obj: Any) -> dict[str, Any]:
    """An object's attributes with each nested settings value spread into its own fields (a run's
    record keeps the flags' names: ``max_seq_len``, not ``model``)."""
    out: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out |= {f.name: getattr(value, f.name) for f in fields(value)}
        else:
            out[name] = value
    return out


def set_flat(obj: Any, name: str, value: Any) -> None:
    """Set ``name`` on ``obj``, or on the nested settings value of ``obj`` that has a field of that name."""
    if name not in vars(obj):
        for attr, held in vars(obj).items():
            if (
                dataclasses.is_dataclass(held)
                and not isinstance(held, type)
                and name in {f.name for f in fields(held)}
            ):
                setattr(obj, attr, dataclasses.replace(held, **{name: value}))
                return
    setattr(obj, name, value)


def options_from(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """``cls`` from the parsed flags (its flag fields present in ``args``) and ``given`` values."""
    values: dict[str, Any] = {}
    for f in flag_fields(cls):
        spec: Flag = f.metadata[FLAG_KEY]
        if spec.nested is not None:
            values[f.name] = nested_value(f, args)
            continue
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if f.metadata[FLAG_KEY].repeat else value
    return cls(**values, **given)


def flags_command(
    prog: str,
    description: str,
    options_type: type[T],
    execute: Callable[[T], object],
    failures: Sequence[Failure] = (),
) -> OptionsCommand[T]:
    """The entry point of a command whose flags are one per field of ``options_type`` (its types, defaults
    and help) and whose work is one call, ``execute(options)``: what each exporter's command line is.
    Its ``build_parser`` and ``options_from_args`` are the parser and the flags-to-options step alone."""

    def build_parser() -> Parser:
        parser = Parser(prog=prog, description=description)
        add_flags(parser, options_type)
        return parser

    def options_from_args(args: argparse.Namespace) -> T:
        return options_from(options_type, args)

    return OptionsCommand(prog, build_parser, options_from_args, execute, tuple(failures))
