"""Where the tests find things: the repository, the shipped sample and the optional ``../shared`` data.

The sample's paths come from the product (``train.common.sample_data``), so the tests read exactly what
every default points at. ``../shared/data/squad2`` is larger SQuAD data that may sit beside the
repository; tests that use it fall back to the sample or skip when it is absent.
"""

from __future__ import annotations

from pathlib import Path

from train.common.sample_data import SAMPLE_CALIBRATION, SAMPLE_CORPUS, SAMPLE_DEV, SAMPLE_DIR, SAMPLE_TRAIN

REPO = Path(__file__).resolve().parents[1]
SAMPLE = SAMPLE_DIR
SHARED_SQUAD = REPO.parent / "shared" / "data" / "squad2"
SHARED_DEV_NAME = "dev-v2.0.cs224n-13.json"
SHARED_TEST_NAME = "test-v2.0.cs224n.json"

__all__ = [
    "REPO",
    "SAMPLE",
    "SAMPLE_CALIBRATION",
    "SAMPLE_CORPUS",
    "SAMPLE_DEV",
    "SAMPLE_TRAIN",
    "SHARED_DEV_NAME",
    "SHARED_SQUAD",
    "SHARED_TEST_NAME",
    "shared_squad_file",
]


def shared_squad_file(name: str) -> Path | None:
    """A file of ``../shared/data/squad2``: None on a fresh clone without ``../shared`` (tests then use
    the sample or skip, saying so); an error when ``../shared`` is there but the file cannot be read, so
    CI never silently tests less than it should."""
    if not SHARED_SQUAD.parent.parent.exists():
        return None
    path = SHARED_SQUAD / name
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise RuntimeError(f"{path}: ../shared is present but this file cannot be read ({exc})") from None
    return path
