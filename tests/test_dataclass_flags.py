"""train.common.dataclass_flags: a dataclass's fields become a command's flags, and the parsed flags the
dataclass again, with each field's type, default, help and choices."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from train.common.cli import Parser
from train.common.dataclass_flags import add_flags, flag, flag_fields, options_from


def pair(text: str) -> tuple[int, int]:
    a, _, b = text.partition("x")
    return int(a), int(b)


@dataclass(frozen=True)
class Options:
    source: Path = flag(help="where from")
    rate: float = flag(0.5, help="share in %")
    mode: str = flag("fast", choices=("fast", "exact"))
    limit: int | None = flag(None)
    check: bool = flag(True, help="verify")
    loud: bool = flag(False)
    inputs: list[str] | None = flag(None)
    shape: tuple[int, int] = flag((8, 384), parse=pair, metavar="BxS")
    providers: tuple[str, ...] = flag((), name="--provider", repeat=True)
    not_a_flag: int = 7


def parse(argv: list[str], **kw) -> Options:
    parser = Parser(prog="t")
    add_flags(parser, Options, **kw)
    return options_from(Options, parser.parse_args(argv))


def test_the_bare_command_line_is_the_defaults_and_every_kind_of_field_parses() -> None:
    assert parse(["--source", "a"]) == Options(source=Path("a"))
    got = parse(
        ["--source", "a", "--rate", "0.25", "--mode", "exact", "--limit", "3", "--no-check", "--loud"]
        + ["--inputs", "x", "y", "--shape", "4x128", "--provider", "cuda", "--provider", "cpu"]
    )
    assert got == Options(Path("a"), 0.25, "exact", 3, False, True, ["x", "y"], (4, 128), ("cuda", "cpu"))
    assert "not_a_flag" not in {f.name for f in flag_fields(Options)}


def test_help_comes_from_the_fields_and_a_percent_sign_survives() -> None:
    parser = Parser(prog="t")
    add_flags(parser, Options)
    text = parser.format_help()
    assert "share in %" in text and "where from" in text and "--check, --no-check" in text
    assert "{fast,exact}" in text and "--provider PROVIDER" in text and "--shape BxS" in text


def test_a_required_field_a_bad_choice_and_a_bad_value_are_one_line_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in ([], ["--source", "a", "--mode", "slow"], ["--source", "a", "--rate", "half"]):
        with pytest.raises(SystemExit) as exit_:
            parse(argv)
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("t: error:")


def test_another_command_takes_some_of_the_flags_with_its_own_defaults_and_requirements() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, Options, ["rate", "mode"], {"rate": 0.9}, required=["mode"])
    assert vars(parser.parse_args(["--mode", "fast"])) == {"rate": 0.9, "mode": "fast"}
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_a_command_that_runs_a_recipe_twice_prefixes_each_runs_flags() -> None:
    parser = argparse.ArgumentParser()
    add_flags(
        parser, Options, ["rate", "limit"], {"rate": 0.1}, prefix="first", spell={"limit": "--first-max"}
    )
    add_flags(parser, Options, ["rate"], prefix="second")
    args = parser.parse_args(["--first-rate", "0.2", "--first-max", "4"])
    assert vars(args) == {"first_rate": 0.2, "first_max": 4, "second_rate": 0.5}
