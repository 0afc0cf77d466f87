"""SentencePiece tokenizer with the conventions of the original XLNet code (torch-free).

The ONNX/TensorRT server imports this package, so it depends on numpy, sentencepiece and the standard
library only. One module per job: :mod:`.normalize` (the original ``preprocess_text``, and its
character-aligned replay), :mod:`.spm_tokenizer` (:class:`XLNetTokenizer`, special pieces, file names),
:mod:`.training` (:func:`train_spm`) and :mod:`.cli` (``python -m train.tokenizer``).
"""

from train.common.contract import (
    BOS_ID,
    CLS_ID,
    EOD_ID,
    EOP_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    SEG_ID_A,
    SEG_ID_B,
    SEG_ID_CLS,
    SEG_ID_PAD,
    SEP_ID,
    UNK_ID,
)

from .cli import main
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
    "BOS_ID",
    "CLS_ID",
    "CONFIG_FILE",
    "CONTROL_SYMBOLS",
    "EOD_ID",
    "EOP_ID",
    "EOS_ID",
    "MASK_ID",
    "MODEL_FILE",
    "PAD_ID",
    "PUNCT_SYMBOLS",
    "SEG_ID_A",
    "SEG_ID_B",
    "SEG_ID_CLS",
    "SEG_ID_PAD",
    "SEP_ID",
    "SPECIAL_PIECES",
    "SPIECE_UNDERLINE",
    "UNK_ID",
    "USER_SYMBOLS",
    "XLNetTokenizer",
    "main",
    "preprocess_text",
    "summary_lines",
    "train_spm",
]
