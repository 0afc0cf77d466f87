"""XLNet pretraining data pipeline in numpy (after `data_utils.py` of zihangdai/xlnet).

streams      -- tokenised corpus as one array, cut into parallel streams (bi_data, ranks)
segments     -- segments A/B at sentence boundaries, example layout and segment ids
spans        -- span-based choice of the prediction targets
permutation  -- local factorisation orders -> perm_mask, target_mapping
pipeline     -- `PretrainBatches`: resumable, deterministic batches of numpy arrays
"""

from qa_core.contract import CLS_ID, EOD_ID, SEP_ID
from train.data.config import PretrainDataConfig
from train.data.permutation import (
    content_stream_can_see,
    example_permutation,
    query_stream_can_see,
    target_arrays,
)
from train.data.pretrain_batches import PretrainBatches, batches_per_pass
from train.data.segments import SegmentPair, assemble_example, split_a_and_b
from train.data.spans import SpanMask, sample_span_mask
from train.data.streams import StreamRows, TokenStream, stream_rows, tokenize_documents

__all__ = [
    "CLS_ID",
    "EOD_ID",
    "SEP_ID",
    "PretrainBatches",
    "PretrainDataConfig",
    "SegmentPair",
    "SpanMask",
    "StreamRows",
    "TokenStream",
    "assemble_example",
    "batches_per_pass",
    "content_stream_can_see",
    "example_permutation",
    "query_stream_can_see",
    "sample_span_mask",
    "split_a_and_b",
    "stream_rows",
    "target_arrays",
    "tokenize_documents",
]
