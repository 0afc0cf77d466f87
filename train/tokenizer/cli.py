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
from dataclasses import asdict

from qa_core.tokenizer.spm_tokenizer import XLNetTokenizer
from train.common.cli import Parser
from train.common.dataclass_flags import add_flags, options_from

from .spm_options import SpmOptions
from .training import summary_lines, train_spm


def _build_parser() -> argparse.ArgumentParser:
    """The files, then one flag per field of :class:`SpmOptions`."""
    p = Parser(
        prog="python -m train.tokenizer",
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
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if needed)")
    add_flags(p, SpmOptions)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m train.tokenizer``; returns the exit code (2 on bad input)."""
    args = _build_parser().parse_args(argv)
    options = options_from(SpmOptions, args)
    t0 = time.perf_counter()
    try:
        knobs = {k: v for k, v in asdict(options).items() if k != "vocab_size"}
        model_path = train_spm(args.input, args.out, options.vocab_size, **knobs)
        tok = XLNetTokenizer.from_dir(model_path.parent)
        seconds = time.perf_counter() - t0
    except (OSError, ValueError) as e:
        print(f"python -m train.tokenizer: error: {e}", file=sys.stderr)
        return 2
    for line in summary_lines(tok, model_path, args.input, options.vocab_size, options.split_digits, seconds):
        print(line)
    return 0
