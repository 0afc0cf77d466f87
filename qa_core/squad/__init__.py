"""SQuAD 2.0 as both training and serving run it (torch-free): the example types, XLNet features over
windows, answer decoding, the span re-ranker and the answerability rule's application. Imports numpy,
the standard library and :mod:`qa_core` only.
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
    squad_bytes,
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
from .prediction import Deciding, NBestEntry, Prediction, answers_and_na_probs

__all__ = [
    "pad_batch",
    "subsample_out_of_window",
    "align_answer",
    "alignment_report",
    "AlignmentFailure",
    "Answer",
    "answer_survives",
    "Answerability",
    "AnswerabilityError",
    "answers_and_na_probs",
    "article_titles",
    "ContextIndex",
    "Dataset",
    "dataset_stats",
    "Deciding",
    "decode",
    "decode_all",
    "decode_all_beam",
    "decode_all_head_outputs",
    "decode_beam",
    "decode_head_outputs",
    "DecodeOptions",
    "DEFAULT_DECODING",
    "examples_from_dataset",
    "Feature",
    "feature_answer_text",
    "featurize",
    "featurize_encoded",
    "featurize_one",
    "featurize_with",
    "group_features",
    "load_dataset",
    "merge_datasets",
    "NBestEntry",
    "Prediction",
    "read_squad",
    "select_articles",
    "SharedContextIndexes",
    "simple_null_logit",
    "span_text",
    "SpanScores",
    "split_by_article",
    "squad_bytes",
    "SquadExample",
    "TokenizerLike",
    "VERIFIER_LOGIT",
    "write_squad",
]
