"""Shared command-line plumbing: user errors become one clear line and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
)


def to_stderr(line: str) -> None:
    """A library's warning callback for a command: the line on stderr, beside the progress on stdout."""
    print(line, file=sys.stderr)


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in --help, once: argparse's own formatter skips options without a help
    string (so `--steps` hid its default) and repeats a default the help text already explains."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings and self._shown(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or not self._shown(action):
            return text
        return super()._get_help_string(action)

    @staticmethod
    def _shown(action: argparse.Action) -> bool:
        """A default worth printing: not absent (None), not a switch's False, not suppressed."""
        return not any(action.default is absent for absent in (None, False, argparse.SUPPRESS))


class Parser(argparse.ArgumentParser):
    """argparse that shows defaults in --help and exits 2 with a one-line message on bad flags."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def run(
    main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None, prog: str = ""
) -> int:
    """Call `main`; turn expected user errors into `prog: error: ...` + exit 2."""
    try:
        return main(argv)
    except USER_ERRORS as exc:
        print(f"{prog or 'error'}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, file-size limit, I/O error: one line, exit 1
        print(f"{prog or 'error'}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class Failure:
    """An exception a command expects from its work and reports itself: ``PROG: error:`` and then
    ``message`` (``{exc}`` is the exception's text) on one line, and this exit code."""

    kind: type[Exception]
    code: int
    message: str = "{exc}"


@dataclass(frozen=True)
class OptionsCommand(Generic[OptionsT]):
    """The entry point of a command whose flags become one options object for one library call (the
    exporters): parse, build the options, run; ``failures`` end as they say, user errors as :func:`run`
    makes them (one line, exit 2), success is 0."""

    prog: str
    build_parser: Callable[[], argparse.ArgumentParser]
    options_from_args: Callable[[argparse.Namespace], OptionsT]
    execute: Callable[[OptionsT], object]
    failures: tuple[Failure, ...] = ()

    def __call__(self, argv: Sequence[str] | None = None) -> int:
        return run(self._main, argv, prog=self.prog)

    def _main(self, argv: Sequence[str] | None) -> int:
        options = self.options_from_args(self.build_parser().parse_args(argv))
        try:
            self.execute(options)
        except tuple(f.kind for f in self.failures) as exc:
            failure = next(f for f in self.failures if isinstance(exc, f.kind))
            print(f"{self.prog}: error: {failure.message.format(exc=exc)}", file=sys.stderr)
            return failure.code
        return 0
