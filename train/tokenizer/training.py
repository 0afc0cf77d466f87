"""Training a sentencepiece model with the original XLNet flags, written as a tokenizer directory.

Kept apart from :class:`XLNetTokenizer` because only the training side needs the trainer's flags,
the punctuation constraint and the corpus readers; loading and encoding a model (the server) does not.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from qa_core.tokenizer.normalize import _clean, preprocess_text
from qa_core.tokenizer.spm_tokenizer import (
    CONTROL_SYMBOLS,
    MODEL_FILE,
    SPECIAL_PIECES,
    USER_SYMBOLS,
    XLNetTokenizer,
)

from .spm_options import SPM_DEFAULTS

# The original ``--user_defined_symbols=<eop>,.,(,),",-,–,£,€`` less <eop> (USER_SYMBOLS). We keep
# these characters whole pieces of their own, but as a training-time constraint on ordinary pieces, not
# as user-defined symbols: see train_spm for why (HuggingFace parity).
PUNCT_SYMBOLS: tuple[str, ...] = (".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")


# Training-only word boundary (sentencepiece's ``pretokenization_delimiter``), put around PUNCT_SYMBOLS.
# A private-use character: nmt_nfkc keeps it, and it does not occur in ordinary text.
_TRAIN_DELIMITER = "\ue000"
_MAX_SENTENCE_LENGTH_LIMIT = 1 << 30  # sentencepiece's upper bound for max_sentence_length


def _sp_error(e: Exception, vocab_size: int) -> ValueError:
    """Turn sentencepiece's terse trainer errors into actionable messages."""
    msg = str(e)
    m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
    if m:
        return ValueError(
            f"vocab_size={vocab_size} is too large for this corpus: use --vocab-size {m.group(2)} or less "
            "(or accept a smaller vocabulary: hard_vocab_limit=False, i.e. no --hard-vocab-limit)"
        )
    m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", msg)
    if m:
        return ValueError(
            f"vocab_size={vocab_size} is too small: the corpus needs {m.group(2)} pieces for its characters and "
            "the special symbols; use a larger --vocab-size or a lower character_coverage"
        )
    if "sentences_.empty()" in msg or "all_chars_count" in msg:
        return ValueError("no text found in the inputs (empty files?)")
    return ValueError(f"sentencepiece training failed: {msg.strip()}")


def train_spm(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    vocab_size: int,
    *,
    model_type: str = "unigram",
    character_coverage: float = SPM_DEFAULTS.character_coverage,
    input_sentence_size: int = SPM_DEFAULTS.input_sentence_size,
    seed: int = SPM_DEFAULTS.seed,
    do_lower_case: bool = SPM_DEFAULTS.do_lower_case,
    remove_space: bool = True,
    keep_accents: bool = SPM_DEFAULTS.keep_accents,
    hard_vocab_limit: bool = SPM_DEFAULTS.hard_vocab_limit,
    num_threads: int = SPM_DEFAULTS.num_threads,
    max_sentence_length: int = 1 << 15,
    split_digits: bool = SPM_DEFAULTS.split_digits,
    punct_symbols: Iterable[str] = PUNCT_SYMBOLS,
    verbose: bool = SPM_DEFAULTS.verbose,
) -> Path:
    """Train a sentencepiece model with the original XLNet flags and write a tokenizer dir; return ``spiece.model``.

    Flags follow the XLNet README (unigram, ``character_coverage=0.99995``, control symbols
    ``<cls>,<sep>,<pad>,<mask>,<eod>``, user symbol ``<eop>``, shuffled input), which yields the id
    layout in :data:`SPECIAL_PIECES`. Lines are preprocessed exactly as encoding will preprocess them.
    ``inputs`` are plain-text or SQuAD JSON files (see :mod:`train.common.corpus`). Deterministic for a given
    input, ``seed`` and ``num_threads``. With ``hard_vocab_limit=False`` (default) a corpus too small for
    ``vocab_size`` gives a smaller vocabulary instead of an error; check ``XLNetTokenizer.vocab_size``.

    Two deviations from the README, both so that SQuAD answers map back to their exact text (a piece
    that glues a word or number to trailing punctuation -- ``1971,``, ``).``, ``".`` -- cannot be cut
    at the answer's end):

    * ``punct_symbols`` (default :data:`PUNCT_SYMBOLS`, the README's other user symbols
      ``. ( ) " - – £ €``) never join another character in a learnt piece, and are always in the
      vocabulary (``required_chars``). The README makes them user-defined symbols; we instead mark
      them as word boundaries for training only (sentencepiece's ``pretokenization_delimiter``), so the
      model stays an ordinary unigram model. Same segmentation in sentencepiece, but HuggingFace's
      conversion turns user-defined symbols into added tokens that it splits off the raw text before
      its whitespace pre-tokenizer, which then drops the space before them and adds a '▁' after
      (``number (or`` -> ``▁number ( ▁or`` instead of ``▁number ▁ ( or``): ids would no longer match
      HuggingFace's ``XLNetTokenizer`` on ~13% of SQuAD texts. ``()`` or ``""`` disables this.
    * ``split_digits=True`` (default): every digit is its own piece, so no piece joins a digit to
      punctuation or to other digits, so ids equal HuggingFace's whether or not ``<digits>,`` pieces
      are re-split at tokenisation time (the original's ``prepro_utils.encode_pieces``, which
      :class:`XLNetTokenizer` does by default for models that have such pieces).
      ``split_digits=False`` (CLI ``--no-split-digits``) learns multi-digit pieces as the original.

    A ``U+E000`` (private use) character in the training text is taken as a boundary and left out.
    """
    from train.common.corpus import iter_texts  # local import keeps `import train.tokenizer` light

    punct = _check_options(
        model_type,
        vocab_size,
        character_coverage,
        input_sentence_size,
        num_threads,
        max_sentence_length,
        punct_symbols,
    )
    paths = [Path(p) for p in ([inputs] if isinstance(inputs, str | Path) else inputs)]
    texts = iter_texts(paths)  # validates that every path exists before training starts

    # Errors raised while sentencepiece pulls lines (a bad JSON file mid-way) must surface as themselves.
    failure: list[BaseException] = []
    lines = _training_lines(
        texts, punct, failure, do_lower_case, remove_space, keep_accents, max_sentence_length
    )
    options = _trainer_options(
        vocab_size, model_type, character_coverage, input_sentence_size, hard_vocab_limit, num_threads
    )
    options |= _punct_options(punct, max_sentence_length)
    options |= {"split_digits": split_digits, "byte_fallback": False, "minloglevel": 0 if verbose else 2}
    model = _run_trainer(lines, failure, seed, vocab_size, options)
    return _write_tokenizer_dir(Path(out_dir), model, do_lower_case, remove_space, keep_accents)


def _write_tokenizer_dir(
    out: Path, model: bytes, do_lower_case: bool, remove_space: bool, keep_accents: bool
) -> Path:
    """Write ``spiece.model`` and the tokenizer's settings into ``out``; return the model's path."""
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / MODEL_FILE
    model_path.write_bytes(model)
    XLNetTokenizer(model_path, do_lower_case, remove_space, keep_accents).save(out)  # validates ids too
    return model_path


def _trainer_options(
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    input_sentence_size: int,
    hard_vocab_limit: bool,
    num_threads: int,
) -> dict[str, Any]:
    """The original XLNet trainer flags (control symbols, ``<eop>``, shuffled input) with the caller's sizes."""
    return {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "character_coverage": character_coverage,
        "control_symbols": list(CONTROL_SYMBOLS),
        "user_defined_symbols": list(USER_SYMBOLS),
        "shuffle_input_sentence": True,
        "input_sentence_size": input_sentence_size,
        "hard_vocab_limit": hard_vocab_limit,
        "num_threads": num_threads,
    }


def _run_trainer(
    lines: Iterator[str], failure: list[BaseException], seed: int, vocab_size: int, options: dict[str, Any]
) -> bytes:
    """Train in memory and return the model's bytes. A reading error (in ``failure``) is raised as
    itself; sentencepiece's own errors as actionable messages."""
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=lines, model_writer=model, **options)
    except RuntimeError as e:
        if failure:
            raise failure[0] from None
        raise _sp_error(e, vocab_size) from None
    if failure:
        raise failure[0]
    return model.getvalue()


def _check_options(
    model_type: str,
    vocab_size: int,
    character_coverage: float,
    input_sentence_size: int,
    num_threads: int,
    max_sentence_length: int,
    punct_symbols: Iterable[str],
) -> tuple[str, ...]:
    """Refuse options sentencepiece would reject late or tersely; return the punctuation, deduplicated."""
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"model_type must be 'unigram' (XLNet) or 'bpe', got {model_type!r}")
    if vocab_size < len(SPECIAL_PIECES) + 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_PIECES) + 1}, got {vocab_size}")
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage}")
    if 0 < input_sentence_size <= 100:  # sentencepiece's own limit
        raise ValueError(
            f"input_sentence_size must be 0 (every line) or more than 100, got {input_sentence_size}"
        )
    if num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    if max_sentence_length < 1:
        raise ValueError(f"max_sentence_length must be at least 1, got {max_sentence_length}")
    punct = tuple(dict.fromkeys(punct_symbols))  # a str is its characters
    for sym in punct:
        if not isinstance(sym, str) or len(sym) != 1 or sym.isspace() or sym == _TRAIN_DELIMITER:
            raise ValueError(f"punct_symbols must be single non-space characters, got {sym!r}")
    return punct


def _training_lines(
    texts: Iterable[str],
    punct: tuple[str, ...],
    failure: list[BaseException],
    do_lower_case: bool,
    remove_space: bool,
    keep_accents: bool,
    max_sentence_length: int,
) -> Iterator[str]:
    """The lines sentencepiece trains on: preprocessed as encoding will preprocess them, too long ones
    left out, every punctuation character between delimiters. An error while reading is appended to
    ``failure`` (to be re-raised once sentencepiece has returned) and ends the lines."""
    # every punctuation character becomes delimiter + character + delimiter
    isolate = str.maketrans({c: f"{_TRAIN_DELIMITER}{c}{_TRAIN_DELIMITER}" for c in punct})
    try:
        for line in texts:
            line = preprocess_text(_clean(line), do_lower_case, remove_space, keep_accents)
            # the length limit applies to the text, not to the delimiters added below
            if line and len(line.encode("utf-8")) <= max_sentence_length:
                yield line.translate(isolate) if punct else line
    except Exception as e:  # re-raised by train_spm, once sentencepiece has returned
        failure.append(e)


def _punct_options(punct: tuple[str, ...], max_sentence_length: int) -> dict[str, Any]:
    """Trainer options for the punctuation constraint: the delimiter, the characters every vocabulary
    needs, and a sentence length limit that leaves room for the delimiters."""
    expansion = 2 * len(_TRAIN_DELIMITER.encode("utf-8")) + 1 if punct else 1
    options: dict[str, Any] = {
        "max_sentence_length": min(max_sentence_length * expansion, _MAX_SENTENCE_LENGTH_LIMIT)
    }
    if punct:
        options |= {"pretokenization_delimiter": _TRAIN_DELIMITER, "required_chars": "".join(punct)}
    return options


def summary_lines(
    tok: XLNetTokenizer,
    model_path: Path,
    inputs: Sequence[str | Path],
    vocab_size: int,
    split_digits: bool,
    seconds: float,
) -> list[str]:
    """What ``python -m train.tokenizer`` prints about a tokenizer it trained (the study prints it too):
    the vocabulary it got against the one asked for, its flags, its first learnt pieces and an example."""
    from train.common.corpus import iter_texts  # local import keeps `import train.tokenizer` light

    example = next(iter_texts(inputs), "")[:200]
    learnt = [
        tok.id_to_piece(i) for i in range(len(SPECIAL_PIECES), min(tok.vocab_size, len(SPECIAL_PIECES) + 20))
    ]
    lines = [f"trained {model_path} in {seconds:.1f}s from {len(inputs)} file(s)"]
    if tok.vocab_size < vocab_size:
        lines.append(f"vocab size: {tok.vocab_size} (asked for {vocab_size}; the corpus supports no more)")
    else:
        lines.append(f"vocab size: {tok.vocab_size}")
    lines.append(f"special: {' '.join(f'{p}={i}' for i, p in enumerate(SPECIAL_PIECES))}")
    lines.append(
        f"flags: do_lower_case={tok.do_lower_case} keep_accents={tok.keep_accents} remove_space={tok.remove_space} "
        f"split_digits={split_digits}"
    )
    lines.append(f"first learnt pieces: {' '.join(learnt)}")
    if example:
        lines.append(f"example: {example}")
        lines.append(f"  pieces: {' '.join(tok.tokenize(example))}")
        lines.append(f"  ids: {tok.encode(example)}")
    return lines
