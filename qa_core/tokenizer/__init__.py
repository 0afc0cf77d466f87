"""SentencePiece tokenizer with the conventions of the original XLNet code (torch-free).

The server imports this package, so it depends on numpy, sentencepiece and the standard library only. Its
special pieces' ids live in :mod:`qa_core.contract` (their one home). :mod:`.normalize` is the original
``preprocess_text`` and its character-aligned replay; :mod:`.spm_tokenizer` is :class:`XLNetTokenizer`,
the special pieces and the file names. Training a tokenizer is :mod:`train.tokenizer`'s job.
"""

from .normalize import preprocess_text
from .spm_tokenizer import (
    CONFIG_FILE,
    CONTROL_SYMBOLS,
    MODEL_FILE,
    SPECIAL_PIECES,
    SPIECE_UNDERLINE,
    USER_SYMBOLS,
    XLNetTokenizer,
)

__all__ = [
    "CONFIG_FILE",
    "CONTROL_SYMBOLS",
    "MODEL_FILE",
    "SPECIAL_PIECES",
    "SPIECE_UNDERLINE",
    "USER_SYMBOLS",
    "XLNetTokenizer",
    "preprocess_text",
]
