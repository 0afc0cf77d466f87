"""The flags of ``python -m server``, generated from :class:`server.settings.ServerSettings` (one flag per
field, its help the field's description): the one home of the command line, read by the command and by
the benchmarks and tests that start a server's parts with the same flags."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from server.settings import ServerSettings, url_password


def build_parser() -> argparse.ArgumentParser:
    """One flag per settings field (``max_queue`` -> ``--max-queue``), help from its description."""
    p = argparse.ArgumentParser(prog="python -m server", description="Serve an XLNet QA model over HTTP.")
    for name, info in ServerSettings.model_fields.items():
        default = "" if info.default is None else f" (default {info.default})"
        text = (info.description or name.replace("_", " ")) + default
        # Every value is parsed by the settings model (one set of rules and messages for flags and env).
        # A bare boolean flag (``--allow-cpu-fallback``) means true; ``--playground false`` still works.
        flag, help_text = "--" + name.replace("_", "-"), text.replace("%", "%%")
        if info.annotation is bool:
            p.add_argument(flag, dest=name, default=None, help=help_text, nargs="?", const="true")
        else:
            p.add_argument(flag, dest=name, default=None, help=help_text)
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
