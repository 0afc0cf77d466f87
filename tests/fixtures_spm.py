"""Tiny XLNet sentencepiece models trained on the fly from the shipped sample (no downloads).

The fixtures built from these (``spm_dir``, ``xlnet_tok``, ...) live in ``conftest.py``; training
takes well under a second per model on the ~270 KB sample, so each is trained once per session.
"""

from __future__ import annotations

from pathlib import Path

from train.tokenizer import train_spm

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
SHARED_SQUAD = REPO.parent / "shared" / "data" / "squad2"
SHARED_DEV_NAME = "dev-v2.0.cs224n-13.json"
SHARED_TEST_NAME = "test-v2.0.cs224n.json"


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


SAMPLE_INPUTS = (SAMPLE / "corpus.json", SAMPLE / "train.json")
SPM_VOCAB = 2000


def make_tokenizer_dir(
    out_dir: Path, vocab_size: int = SPM_VOCAB, *, do_lower_case: bool = False, inputs=SAMPLE_INPUTS
) -> Path:
    """Train an XLNet spm model on the sample and save a tokenizer directory; returns the directory."""
    train_spm(list(inputs), out_dir, vocab_size, do_lower_case=do_lower_case)
    return Path(out_dir)


# A pretraining run of the tiny preset that takes seconds (8 steps, batch 2 x 32 tokens, log every step).
TINY_PRETRAIN_ARGS = [
    "--corpus",
    str(SAMPLE / "corpus.json"),
    "--config",
    "tiny",
    "--steps",
    "8",
    "--batch-size",
    "2",
    "--seq-len",
    "32",
    "--reuse-len",
    "16",
    "--mem-len",
    "16",
    "--log-every",
    "1",
    "--save-every",
    "100",
    "--no-progress",
    "--lr",
    "1e-3",
    "--warmup",
    "2",
]
