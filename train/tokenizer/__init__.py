"""SentencePiece tokenizer with the conventions of the original XLNet code (torch-free).

The ONNX/TensorRT server imports this package, so it depends on numpy, sentencepiece and the standard
library only. Its special pieces' ids live in :mod:`train.common.contract` (their one home). One module per job: :mod:`.normalize` (the original ``preprocess_text``, and its
character-aligned replay), :mod:`.spm_tokenizer` (:class:`XLNetTokenizer`, special pieces, file names),
:mod:`.training` (:func:`train_spm`) and :mod:`.cli` (``python -m train.tokenizer``).
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
from .training import PUNCT_SYMBOLS, summary_lines, train_spm

__all__ = [
    "CONFIG_FILE",
    "CONTROL_SYMBOLS",
    "MODEL_FILE",
    "PUNCT_SYMBOLS",
    "SPECIAL_PIECES",
    "SPIECE_UNDERLINE",
    "USER_SYMBOLS",
    "XLNetTokenizer",
    "preprocess_text",
    "summary_lines",
    "train_spm",
]
