"""The SQuAD input layout the QA model reads: `paragraph <sep> question <sep> <cls>`, and what follows from it.

Segment ids are 0 paragraph, 1 question, 2 `<cls>`, 3 padding (the original XLNet run_squad.py);
`<sep>` is id 4 in every XLNet vocabulary (the tokenizer checks that layout when it loads).
"""

from __future__ import annotations

import torch

from qa_core.contract import SEG_ID_PARAGRAPH, SEG_ID_QUESTION, SEP_ID


def question_match(
    input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """[B, T] 1.0 where a paragraph token's id occurs in the question, or a question token's in the paragraph.

    The exact-match feature of DrQA (Chen et al. 2017): the cheapest signal of where the question
    points, which a small model trained from scratch does not discover on its own in a few thousand
    steps. Computed from the ids alone, so exported graphs keep their three inputs. `<sep>` and
    padding never match. A MatMul of one-hot comparisons rather than `any()`, which every runtime
    (onnxruntime, TensorRT) implements; counts stay exact in fp16 up to 2048 tokens.
    """
    valid = input_ids != SEP_ID
    if attention_mask is not None:
        valid = valid & (attention_mask != 0)
    paragraph = ((token_type_ids == SEG_ID_PARAGRAPH) & valid).float()
    question = ((token_type_ids == SEG_ID_QUESTION) & valid).float()
    same = (input_ids[:, :, None] == input_ids[:, None, :]).float()  # [B, T, T]
    found = torch.matmul(same, torch.stack([question, paragraph], dim=-1)) > 0  # [B, T, 2]: in Q, in P
    return paragraph * found[..., 0].float() + question * found[..., 1].float()
