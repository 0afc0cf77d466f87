"""``python -m train.tokenizer``: runs :func:`train.tokenizer.cli.main` (user errors: one line, exit 2)."""

import sys

from train.common.cli import run

from .cli import main

sys.exit(run(main, prog="python -m train.tokenizer"))
