"""Which run a directory holds, so a run directory is never silently mixed with or resumed as another.

``OUT/run.json`` records the command, the run's settings (every flag but ``--out``, ``--resume``,
``--overwrite`` and ``--stop-after``), the hash of those that define its result (all but cadence and
machine flags such as ``--log-every`` or ``--threads``), a run id and the start time. The rules, applied by :func:`open_run` before any work:
- a fresh run into a directory that holds another run (a record or step checkpoints) is refused,
  unless ``--overwrite`` (which deletes that run's checkpoints and record first);
- ``--resume`` restores the recorded settings, so ``--out R --resume`` alone continues the run; a flag
  given on the command line that contradicts a result-defining setting is refused, naming each
  difference (cadence and machine flags may change);
- a final model save interrupted between its renames is finished (rolled forward), and leftover
  temporary directories of an interrupted save are removed.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed

from train.common.atomic_dir import atomic_write_text, recover_interrupted
from train.common.dataclass_flags import flat_settings, set_flat
from train.engine.execution import Dist
from train.model.checkpoint import STAGED_FILES, finish_interrupted_save

RUN_FILE = "run.json"
# A run's settings: the parsed flags (argparse.Namespace) or a recipe's config dataclass (one attribute each).
Settings = TypeVar("Settings")
# Flags of one invocation only: never recorded, never restored.
NOT_RECORDED = frozenset({"out", "resume", "overwrite", "stop_after", "explicit_flags"})
# Recorded and restored on --resume, but a resumption may change them (they do not change the result).
MAY_CHANGE = frozenset(
    {
        "no_progress",
        "threads",
        "device",
        "log_every",
        "save_every",
        "keep_last",
        "eval_every",
        "eval_batch_size",
        "activation_checkpointing",
    }
)
# What a training run writes into its directory (what --overwrite removes): checkpoints, the record,
# a tokenizer it trained, logs and plots, the final model's files, the best checkpoint, predictions.
RUN_ARTIFACTS = (
    "checkpoints",
    RUN_FILE,
    "tokenizer",
    "metrics.jsonl",
    "loss.png",
    "dev_f1.png",
    "tensorboard",
    "best",
    "dev_predictions",
    *STAGED_FILES,
)


def explicit_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The destinations the command line set explicitly (whatever their value), for resume checks."""
    saved = {action.dest: action.default for action in parser._actions}
    saved_parser_defaults = dict(parser._defaults)  # set_defaults (a --recipe's values) fills these in too
    try:
        for action in parser._actions:
            action.default = argparse.SUPPRESS
        parser._defaults.clear()
        given, _ = parser.parse_known_args(argv)
    finally:
        for action in parser._actions:
            action.default = saved[action.dest]
        parser._defaults.update(saved_parser_defaults)
    return set(vars(given))


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def recorded_settings(args: Any) -> dict[str, Any]:
    """The run's settings as recorded: every flag but the one-invocation ones, JSON-ready."""
    return {
        k: _jsonable(v)
        for k, v in sorted(flat_settings(args).items())
        if k not in NOT_RECORDED
        and (v is None or isinstance(v, str | int | float | bool | list | tuple | Path))
    }


def settings_hash(settings: dict[str, Any]) -> str:
    """Hash of the settings that define the result (cadence and machine flags left out)."""
    defining = {k: v for k, v in settings.items() if k not in MAY_CHANGE}
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]


def read_record(out: Path) -> dict[str, Any] | None:
    path = Path(out) / RUN_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is unreadable ({exc}); move it away to start a new run there") from None


def _holds_checkpoints(out: Path) -> bool:
    return any((Path(out) / "checkpoints").glob("step-*"))


def clean_temporaries(out: Path) -> list[Path]:
    """What an interrupted save left in the run directory and its checkpoints: see
    :func:`train.common.atomic_dir.recover_interrupted`."""
    return recover_interrupted(Path(out)) + recover_interrupted(Path(out) / "checkpoints")


def _describe(record: dict[str, Any]) -> str:
    return f"a {record.get('command', '?')} run started {record.get('started', '?')} (id {record.get('run_id', '?')})"


def check_run(out: Path, command: str, args: Settings) -> Settings:
    """Apply the rules (see the module docstring) without writing anything; return the args to run
    with (on ``--resume``, a copy holding the recorded settings). Every rank of a distributed job may
    call it."""
    out = Path(out)
    record = read_record(out)
    if getattr(args, "resume", False):
        if record is None:
            return args  # nothing recorded: a new run (or one from before records): nothing to restore
        if record.get("command") != command:
            raise ValueError(f"{out} holds {_describe(record)}, not a {command} run: choose another --out")
        recorded = record.get("settings", {})
        given = getattr(args, "explicit_flags", None)  # None when called from code: every value counts
        current = recorded_settings(args)
        keys: Iterable[str] = recorded if given is None else (k for k in recorded if k in given)
        differs = {
            k: (current[k], recorded[k])
            for k in keys
            if k in current and k not in MAY_CHANGE and current[k] != recorded[k]
        }
        if differs:
            lines = ", ".join(
                f"--{k.replace('_', '-')} {new!r} (recorded {old!r})" for k, (new, old) in differs.items()
            )
            raise ValueError(
                f"--resume: {lines} differ from {_describe(record)}; drop them to continue that run, or start "
                "a new one with --overwrite or another --out"
            )
        restored = copy.copy(args)
        for key, value in recorded.items():
            if not (key in MAY_CHANGE and (given is None or key in given)):
                set_flat(restored, key, value)
        return restored
    if (record is not None or _holds_checkpoints(out)) and not getattr(args, "overwrite", False):
        what = _describe(record) if record is not None else "another run's checkpoints"
        raise ValueError(
            f"{out} holds {what}: add --resume to continue it, --overwrite to replace it, or choose another --out"
        )
    return args


def start_run(out: Path, command: str, args: Any) -> dict[str, Any]:
    """On the writing rank, after :func:`check_run`: remove temporaries, on ``--overwrite`` the old run,
    and write the record if the directory has none. Returns the record."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    finish_interrupted_save(out)
    clean_temporaries(out)
    record = read_record(out)
    if getattr(args, "overwrite", False) and not getattr(args, "resume", False):
        for name in RUN_ARTIFACTS:  # all the old run wrote, so nothing of it is reused or mixed in
            path = out / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        record = None
    if record is None:
        settings = recorded_settings(args)
        record = {
            "command": command,
            "settings": settings,
            "settings_hash": settings_hash(settings),
            "run_id": uuid.uuid4().hex[:12],
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        atomic_write_text(out / RUN_FILE, json.dumps(record, indent=2, sort_keys=True))
    return record


def open_run(
    out: Path,
    command: str,
    args: Settings,
    d: Dist,
    validate: Callable[[Settings], None] | None = None,
) -> Settings:
    """:func:`check_run` on every rank, ``validate`` on the settings to run with (before anything is
    recorded), then :func:`start_run` on rank 0 (barriers between, so no rank reads the record rank 0
    is writing); returns the args to run with."""
    args = check_run(out, command, args)
    if validate is not None:
        validate(args)
    if d.enabled:
        torch.distributed.barrier()
    if d.is_main:
        start_run(out, command, args)
    if d.enabled:
        torch.distributed.barrier()
    return args
