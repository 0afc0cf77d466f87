"""The command line of ``python -m train.tokenizer``: train a tokenizer and print a summary of it.

``python -m train.tokenizer --input FILE [FILE ...] --vocab-size N --out DIR [--lower] [--no-split-digits]``.
Separate from ``__main__.py`` so that :func:`main` can be imported (``train.tokenizer.cli.main``) without
running it; the package does not import it, so the server, which reads the tokenizer, loads no command.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from train.common.cli import Parser

from .spm_tokenizer import XLNetTokenizer
from .training import DEFAULT_NUM_THREADS, summary_lines, train_spm


def _build_parser() -> argparse.ArgumentParser:
    # The help texts state their defaults themselves, hence the plain formatter.
    p = Parser(
        prog="python -m train.tokenizer",
        formatter_class=argparse.HelpFormatter,
        description="Train an XLNet sentencepiece tokenizer (original XLNet flags: unigram, <cls> <sep> <pad> "
        '<mask> <eod> control symbols, <eop> user symbol, . ( ) " - – £ € kept as pieces of their own) and save '
        "spiece.model + tokenizer_config.json.",
    )
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="FILE",
        help="training text: plain-text files (a sentence/paragraph per line, blank line between documents) "
        "or SQuAD JSON files (*.json; paragraph contexts are used)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=32000,
        metavar="N",
        help="number of pieces including the 9 special symbols (default: 32000, as XLNet); a corpus too small "
        "for N gives a smaller vocabulary unless --hard-vocab-limit",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if needed)")
    p.add_argument("--lower", action="store_true", help="lower-case text (an uncased model; default: cased)")
    p.add_argument(
        "--keep-accents", action="store_true", help="keep accents instead of stripping them (NFKD)"
    )
    p.add_argument(
        "--character-coverage",
        type=float,
        default=0.99995,
        metavar="F",
        help="fraction of characters covered by the vocabulary; rarer ones become <unk> (default: 0.99995)",
    )
    p.add_argument(
        "--input-sentence-size",
        type=int,
        default=10_000_000,
        metavar="N",
        help="sample at most N lines for training, 0 for all (default: 10000000)",
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="N", help="random seed for line sampling (default: 0)"
    )
    p.add_argument(
        "--num-threads",
        type=int,
        default=DEFAULT_NUM_THREADS,
        metavar="N",
        help=f"trainer threads; the model depends on it, so keep it fixed to reproduce one (default: {DEFAULT_NUM_THREADS})",
    )
    p.add_argument(
        "--hard-vocab-limit",
        action="store_true",
        help="fail instead of producing a smaller vocabulary when the corpus is too small for --vocab-size",
    )
    p.add_argument(
        "--no-split-digits",
        dest="split_digits",
        action="store_false",
        help="learn multi-digit pieces as the original XLNet (default: every digit is a piece of its own, so "
        "numbers never merge with punctuation and SQuAD answers keep their exact text)",
    )
    p.add_argument("--verbose", action="store_true", help="show sentencepiece's training log")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m train.tokenizer``; returns the exit code (2 on bad input)."""
    args = _build_parser().parse_args(argv)
    t0 = time.perf_counter()
    try:
        model_path = train_spm(
            args.input,
            args.out,
            args.vocab_size,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size,
            seed=args.seed,
            do_lower_case=args.lower,
            keep_accents=args.keep_accents,
            hard_vocab_limit=args.hard_vocab_limit,
            num_threads=args.num_threads,
            split_digits=args.split_digits,
            verbose=args.verbose,
        )
        tok = XLNetTokenizer.from_dir(model_path.parent)
        seconds = time.perf_counter() - t0
    except (OSError, ValueError) as e:
        print(f"python -m train.tokenizer: error: {e}", file=sys.stderr)
        return 2
    for line in summary_lines(tok, model_path, args.input, args.vocab_size, args.split_digits, seconds):
        print(line)
    return 0
