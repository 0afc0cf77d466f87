"""The SQuAD 2.0 sample shipped in the repository (``data/sample/``): what every default points at.

Defaults never point outside the repository, so a fresh clone runs everything; larger data (such as
``../shared/data/squad2/``, see the README) is always passed explicitly.
"""

from __future__ import annotations

from pathlib import Path

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "data" / "sample"
SAMPLE_CORPUS = SAMPLE_DIR / "corpus.json"  # unlabelled text for pretraining and tokenizers
SAMPLE_TRAIN = SAMPLE_DIR / "train.json"
SAMPLE_DEV = SAMPLE_DIR / "dev.json"
SAMPLE_CALIBRATION = SAMPLE_DIR / "calibration.json"  # held out of fine-tuning, to fit answerability on
