"""The flags of ``python -m server``, generated from :class:`server.settings.ServerSettings` (one flag per
field, its help the field's description): the one home of the command line, read by the command and by
the benchmarks and tests that start a server's parts with the same flags."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, Literal, NoReturn, get_args, get_origin

from server.settings import ServerSettings, url_password


class Switch(argparse.Action):
    """A boolean setting's flag: ``--x`` turns it on, ``--no-x`` off; ``--x true|false`` still works."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        both = [*option_strings, *("--no-" + s.removeprefix("--") for s in option_strings)]
        super().__init__(both, dest, nargs="?", metavar="true|false", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        value: Any,
        option: str | None = None,
    ) -> None:
        if option is not None and option.startswith("--no-"):
            if value is not None:
                parser.error(f"{self.dest}: {option} takes no value (it turns the setting off)")
            value = "false"
        setattr(namespace, self.dest, "true" if value is None else value)


class _Formatter(argparse.HelpFormatter):
    """``--x, --no-x`` for a switch (argparse would print each with a value)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Switch):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def choices_of(annotation: Any) -> tuple[str, ...] | None:
    """The values a ``Literal`` setting (or an optional one) may take, as the command line spells them."""
    if get_origin(annotation) is Literal:
        return tuple(str(v) for v in get_args(annotation))
    for arg in get_args(annotation):  # X | None
        if get_origin(arg) is Literal:
            return tuple(str(v) for v in get_args(arg))
    return None


class FlagError(ValueError):
    """A flag the command line got wrong, as one line naming the setting (``torch_dtype: invalid choice
    'fp8' ...``), as a settings value's error names it: the command says it in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        named = re.sub(
            r"^argument --([\w-]+)(?:/--no-[\w-]+)?: ", lambda m: m[1].replace("-", "_") + ": ", message
        )
        raise FlagError(named.replace("invalid choice: ", "invalid choice "))


def build_parser() -> argparse.ArgumentParser:
    """One flag per settings field (``max_queue`` -> ``--max-queue``), help from its description; the
    choices of a ``Literal`` field listed; a boolean field a switch (``--x``, ``--no-x``). A flag that
    cannot be read raises :class:`FlagError` (``--help`` prints and exits as ever)."""
    p = _Parser(
        prog="python -m server", description="Serve an XLNet QA model over HTTP.", formatter_class=_Formatter
    )
    for name, info in ServerSettings.model_fields.items():
        default = (
            ""
            if info.default is None
            else f" (default {str(info.default).lower() if info.annotation is bool else info.default})"
        )
        text = (info.description or name.replace("_", " ")) + default
        # Every value is parsed by the settings model (one set of rules and messages for flags and env).
        flag, help_text = "--" + name.replace("_", "-"), text.replace("%", "%%")
        if info.annotation is bool:
            p.add_argument(flag, dest=name, default=None, help=help_text, action=Switch)
        else:
            p.add_argument(flag, dest=name, default=None, help=help_text, choices=choices_of(info.annotation))
    return p


class SecretInArgv(ValueError):
    """A flag's value holds a secret, which ``ps`` would show to every local user."""


def refuse_secrets(values: dict[str, str]) -> None:
    """SecretInArgv for a flag that carries a password (keys never have a flag at all)."""
    url = values.get("limits_redis")
    if url is not None and url_password(url) is not None:
        raise SecretInArgv(
            "--limits-redis: the URL holds a password, which ps shows to every local user: give the URL in "
            "XLNETQA_LIMITS_REDIS instead, or the password alone in a private file (--limits-redis-password-file)"
        )


def load_settings(argv: Sequence[str] | None = None) -> ServerSettings:
    """Settings from env + flags; raises ValidationError with every problem, SecretInArgv for a secret
    given as a flag."""
    given = {k: v for k, v in vars(build_parser().parse_args(argv)).items() if v is not None}
    refuse_secrets(given)
    return ServerSettings(**given)
