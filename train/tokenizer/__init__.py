"""Training a SentencePiece tokenizer the way the original XLNet did (:func:`train_spm`, torch-free) and its
command (``python -m train.tokenizer``). The tokenizer itself is :mod:`qa_core.tokenizer`.
"""

from .training import PUNCT_SYMBOLS, summary_lines, train_spm

__all__ = ["PUNCT_SYMBOLS", "summary_lines", "train_spm"]
