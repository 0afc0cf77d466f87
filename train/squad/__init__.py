"""Torch-free SQuAD 2.0: data files, XLNet features, answer decoding and the official metrics.

Shared by training/evaluation and by the HTTP server, so it imports only numpy, the standard
library and :mod:`train.tokenizer` (never torch).
"""

from .alignment import (
    AlignmentFailure,
    TokenizerLike,
    align_answer,
    alignment_report,
    answer_survives,
    span_text,
)
from .answerability import Answerability
from .answerability_features import VERIFIER_LOGIT, ContextIndex, SpanScores
from .answerability_params import AnswerabilityError
from .batches import pad_batch, subsample_out_of_window
from .data import (
    Answer,
    Dataset,
    SquadExample,
    article_titles,
    dataset_stats,
    examples_from_dataset,
    load_dataset,
    merge_datasets,
    read_squad,
    select_articles,
    split_by_article,
    write_squad,
)
from .decode import DEFAULT_DECODING, DecodeOptions, decode, decode_beam
from .features import (
    Feature,
    feature_answer_text,
    featurize,
    featurize_encoded,
    featurize_one,
    featurize_with,
)
from .head_outputs import (
    SharedContextIndexes,
    decode_all,
    decode_all_beam,
    decode_all_head_outputs,
    decode_head_outputs,
    group_features,
    simple_null_logit,
)
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
from .prediction import Deciding, NBestEntry, Prediction, answers_and_na_probs

__all__ = [
    "AlignmentFailure",
    "Answer",
    "Answerability",
    "AnswerabilityError",
    "ContextIndex",
    "Deciding",
    "DecodeOptions",
    "DEFAULT_DECODING",
    "SharedContextIndexes",
    "SpanScores",
    "VERIFIER_LOGIT",
    "Dataset",
    "Feature",
    "NBestEntry",
    "Prediction",
    "SquadExample",
    "TokenizerLike",
    "align_answer",
    "alignment_report",
    "answer_survives",
    "answers_and_na_probs",
    "apply_no_answer_threshold",
    "article_titles",
    "compute_exact",
    "compute_f1",
    "dataset_stats",
    "decode",
    "decode_all",
    "decode_all_beam",
    "decode_beam",
    "evaluate",
    "examples_from_dataset",
    "feature_answer_text",
    "featurize",
    "featurize_encoded",
    "featurize_one",
    "featurize_with",
    "subsample_out_of_window",
    "find_best_thresh",
    "group_features",
    "load_dataset",
    "normalize_answer",
    "pad_batch",
    "paired_bootstrap",
    "per_group_means",
    "per_question_f1",
    "raw_scores",
    "read_squad",
    "select_articles",
    "decode_all_head_outputs",
    "decode_head_outputs",
    "simple_null_logit",
    "span_text",
    "merge_datasets",
    "split_by_article",
    "write_squad",
]
