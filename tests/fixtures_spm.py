"""Tiny XLNet sentencepiece models trained on the fly from the shipped sample (no downloads).

Import the fixtures into a test module (``from fixtures_spm import spm_dir, ...``); training takes
well under a second per model on the ~270 KB sample, so every model is trained once per session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from train.tokenizer import XLNetTokenizer, train_spm

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
SHARED_SQUAD = REPO.parent / "shared" / "data" / "squad2"
SAMPLE_INPUTS = (SAMPLE / "corpus.json", SAMPLE / "train.json")
SPM_VOCAB = 2000


def make_tokenizer_dir(
    out_dir: Path, vocab_size: int = SPM_VOCAB, *, do_lower_case: bool = False, inputs=SAMPLE_INPUTS
) -> Path:
    """Train an XLNet spm model on the sample and save a tokenizer directory; returns the directory."""
    train_spm(list(inputs), out_dir, vocab_size, do_lower_case=do_lower_case)
    return Path(out_dir)


@pytest.fixture(scope="session")
def spm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cased 2000-piece XLNet tokenizer directory (spiece.model + tokenizer_config.json)."""
    return make_tokenizer_dir(tmp_path_factory.mktemp("spm_cased"))


@pytest.fixture(scope="session")
def spm_dir_lower(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, uncased (do_lower_case=True at training and encoding time)."""
    return make_tokenizer_dir(tmp_path_factory.mktemp("spm_lower"), do_lower_case=True)


@pytest.fixture(scope="session")
def xlnet_tok(spm_dir: Path) -> XLNetTokenizer:
    return XLNetTokenizer.from_dir(spm_dir)


@pytest.fixture(scope="session")
def xlnet_tok_lower(spm_dir_lower: Path) -> XLNetTokenizer:
    return XLNetTokenizer.from_dir(spm_dir_lower)
