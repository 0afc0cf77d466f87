"""Shared pytest fixtures: tiny random models and paths to the data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "squad2"
SAMPLE = REPO / "data" / "sample"

# Keep the suite predictable on 2 cores.
# One intra-op thread: subprocesses (servers, torchrun ranks) share 2 cores with the test process,
# and OpenMP spin-waiting under oversubscription makes 2-thread runs 10-30x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def shared_squad() -> Path:
    if not SHARED.exists():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return SAMPLE
