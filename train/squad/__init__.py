"""SQuAD 2.0 on the training side (torch-free): the official metrics, run provenance.

What serving runs too (the example types, features, decoding, answerability) lives in :mod:`qa_core.squad`.
"""

from .metrics import (
    apply_no_answer_threshold,
    compute_exact,
    compute_f1,
    evaluate,
    find_best_thresh,
    normalize_answer,
    paired_bootstrap,
    per_group_means,
    per_question_f1,
    raw_scores,
)

__all__ = [
    "apply_no_answer_threshold",
    "compute_exact",
    "compute_f1",
    "evaluate",
    "find_best_thresh",
    "normalize_answer",
    "paired_bootstrap",
    "per_group_means",
    "per_question_f1",
    "raw_scores",
]
