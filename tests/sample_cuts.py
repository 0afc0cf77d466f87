"""Smaller copies of the shipped sample's files, for tests that run whole pipelines on a budget."""

from __future__ import annotations

import json
from pathlib import Path

from paths import SAMPLE_CALIBRATION, SAMPLE_DEV


def first_paragraphs(source: Path, path: Path, paragraphs: int = 3) -> Path:
    """``source`` with each article cut to its first ``paragraphs``: the same articles, so whatever
    is split or cross-fitted by article still is, at a test's cost."""
    data = json.loads(source.read_text())
    for article in data["data"]:
        article["paragraphs"] = article["paragraphs"][:paragraphs]
    path.write_text(json.dumps(data))
    return path


def small_calibration(path: Path, paragraphs: int = 3) -> Path:
    """The sample's two calibration articles, each cut to its first paragraphs."""
    return first_paragraphs(SAMPLE_CALIBRATION, path, paragraphs)


def small_dev(path: Path, paragraphs: int = 3) -> Path:
    """The sample's evaluated article, cut to its first paragraphs."""
    return first_paragraphs(SAMPLE_DEV, path, paragraphs)
