"""Smaller copies of the shipped sample's files, for tests that run whole pipelines on a budget."""

from __future__ import annotations

import json
from pathlib import Path

from paths import SAMPLE_CALIBRATION, SAMPLE_DEV, SAMPLE_TRAIN


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


def first_article_split(root: Path, train_paragraphs: int, dev_paragraphs: int) -> tuple[Path, Path]:
    """``root/train.json`` and ``root/dev.json``: the sample's first training article and its first
    evaluated article, each cut to its first paragraphs (a fine-tuning run at a test's cost)."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for source, name, paragraphs in (
        (SAMPLE_TRAIN, "train", train_paragraphs),
        (SAMPLE_DEV, "dev", dev_paragraphs),
    ):
        data = json.loads(source.read_text())
        data["data"] = [{**data["data"][0], "paragraphs": data["data"][0]["paragraphs"][:paragraphs]}]
        out.append(root / f"{name}.json")
        out[-1].write_text(json.dumps(data))
    return out[0], out[1]
