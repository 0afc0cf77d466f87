"""transformers' XLNet as the pretraining oracle: the same batch in, its own loss and memory out."""

from __future__ import annotations

import torch


def hf_loss(hf, batch: dict[str, torch.Tensor], mems=None):
    """transformers' own loss (its ``labels``, -100 where a target row is padding) and new memory."""
    labels = batch["target_ids"].masked_fill(batch["target_weights"] == 0, -100)
    out = hf(
        batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        perm_mask=batch["perm_mask"],
        target_mapping=batch["target_mapping"],
        labels=labels,
        mems=mems,
        use_mems=True,
    )
    return out.loss, out.mems
