"""What a pipeline stage was made from, recorded beside it, so that a stage is reused only for the inputs
it was made from.

A multi-hour pipeline (``train.crossfit``) reuses every finished stage of an earlier call and resumes an
interrupted one from its checkpoint. Reused on existence alone, a stage made from other inputs (another
``--labelled``, ``--folds`` or ``--corpus``, other steps) would be taken silently: a fold reader that
trained on articles it is now asked to score out of fold inflates every out-of-fold figure. So each stage
records its inputs (settings as given, files by the SHA-256 of their bytes, an earlier stage by its own
record) before it starts, and a later call with other inputs stops with a one-line error naming what
differs, before any work on that stage.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from train.common.atomic_dir import atomic_write_text

RECORD = "inputs.json"


class StageInputsChanged(ValueError):
    """A stage's folder holds work made from other inputs than this call's (a one-line user error)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_fingerprint(data: bytes) -> dict[str, str]:
    """What :func:`fingerprint` records for a file holding ``data``, before the file is written."""
    return {"sha256": hashlib.sha256(data).hexdigest()}


def fingerprint(value: Any) -> Any:
    """A value as recorded: a file by its bytes' SHA-256, a stage's folder by its own record's, a list
    item by item, anything else as given (JSON-ready)."""
    if isinstance(value, (list, tuple)):
        return [fingerprint(v) for v in value]
    if isinstance(value, (str, Path)) and str(value):
        path = Path(value)
        if path.is_file():
            return {"sha256": _sha256(path)}
        if (path / RECORD).is_file():
            return {"stage": _sha256(path / RECORD)}
    return value


def check_stage_inputs(
    record: Path, name: str, inputs: Mapping[str, Any], *, made: bool, output: Path | None = None
) -> None:
    """Record ``inputs`` at ``record`` for a stage about to run or be reused, or refuse when its work
    there was made from other inputs. ``made``: some of the stage's work is there (finished, or a
    checkpoint). A record of other inputs beside no work (a call stopped before the stage made anything)
    is replaced; work without a readable record (made before records were kept) is taken as made from
    these inputs, and the call says so. ``output``: what the stage makes, named in the refusal (default:
    the record's folder, a stage's own)."""
    # as JSON keeps it (tuples become lists), so a record read back equals the same inputs given again
    now = json.loads(json.dumps({key: fingerprint(value) for key, value in sorted(inputs.items())}))
    before = None
    if record.exists():
        try:
            before = json.loads(record.read_text())
        except (OSError, ValueError):
            before = None  # damaged: it proves nothing either way
    if before == now:
        return
    if isinstance(before, dict) and made:
        differ = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        what = output if output is not None else record.parent
        raise StageInputsChanged(
            f"[{name}] {what} was made from other inputs ({', '.join(differ)} differ): give another --out, "
            f"or remove {what.name}{'' if output is None else f' and {record.name}'} to make it again"
        )
    if made and before is None:
        print(f"[{name}] no record of what made {record.parent}: recorded as this call's inputs", flush=True)
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, json.dumps(now, indent=1, ensure_ascii=False) + "\n")  # whole or absent
