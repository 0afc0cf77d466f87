"""The knobs of training a sentencepiece tokenizer (the original XLNet's flags and ours): one
:class:`SpmOptions`, whose defaults :func:`train.tokenizer.training.train_spm` takes and whose fields are
the flags of ``python -m train.tokenizer`` (:mod:`train.common.dataclass_flags`)."""

from __future__ import annotations

from dataclasses import dataclass

from train.common.dataclass_flags import flag


@dataclass(frozen=True)
class SpmOptions:
    """How a tokenizer is trained (the input files and the output directory aside)."""

    vocab_size: int = flag(
        32000,
        metavar="N",
        help="number of pieces including the 9 special symbols (as XLNet); a corpus too small for N gives a "
        "smaller vocabulary unless --hard-vocab-limit",
    )
    do_lower_case: bool = flag(False, name="--lower", help="lower-case text (an uncased model; else cased)")
    keep_accents: bool = flag(False, help="keep accents instead of stripping them (NFKD)")
    character_coverage: float = flag(
        0.99995, metavar="F", help="fraction of characters covered by the vocabulary; rarer ones become <unk>"
    )
    input_sentence_size: int = flag(
        10_000_000, metavar="N", help="sample at most N lines for training, 0 for all"
    )
    seed: int = flag(0, metavar="N", help="random seed for line sampling")
    # fixed (not cpu_count) so training gives the same model on every machine
    num_threads: int = flag(
        4, metavar="N", help="trainer threads; the model depends on it, so keep it fixed to reproduce one"
    )
    hard_vocab_limit: bool = flag(
        False,
        help="fail instead of producing a smaller vocabulary when the corpus is too small for --vocab-size",
    )
    split_digits: bool = flag(
        True,
        help="every digit is a piece of its own, so numbers never merge with punctuation and SQuAD answers keep "
        "their exact text (--no-split-digits learns multi-digit pieces, as the original XLNet)",
    )
    verbose: bool = flag(False, help="show sentencepiece's training log")


SPM_DEFAULTS = SpmOptions()
