"""Tiny XLNet sentencepiece models trained on the fly from the shipped sample (no downloads).

The fixtures built from these (``spm_dir``, ``xlnet_tok``, ...) live in ``conftest.py``; training
takes well under a second per model on the ~270 KB sample, so each is trained once per session.
"""

from __future__ import annotations

from pathlib import Path

from paths import SAMPLE_CORPUS, SAMPLE_TRAIN

from train.tokenizer import train_spm

SAMPLE_INPUTS = (SAMPLE_CORPUS, SAMPLE_TRAIN)
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
    str(SAMPLE_CORPUS),
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


def pad_vocabulary(spm_file: Path, out_file: Path, vocab_size: int) -> Path:
    """A copy of ``spm_file`` with unused pieces after the 9 special ones, ``vocab_size`` in all: every
    real piece moves to the top of the id range (ids up to ``vocab_size - 1``), as in a published
    32,000-piece vocabulary, while encoding picks the same pieces (unused pieces never match)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    from qa_core.tokenizer.spm_tokenizer import SPECIAL_PIECES

    model = pb.ModelProto()
    model.ParseFromString(Path(spm_file).read_bytes())
    pieces = list(model.pieces)
    del model.pieces[:]
    model.pieces.extend(pieces[: len(SPECIAL_PIECES)])
    for i in range(vocab_size - len(pieces)):
        model.pieces.add(piece=f"<unused{i}>", score=0.0, type=pb.ModelProto.SentencePiece.UNUSED)
    model.pieces.extend(pieces[len(SPECIAL_PIECES) :])
    model.trainer_spec.vocab_size = vocab_size
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_bytes(model.SerializeToString())
    return out_file
