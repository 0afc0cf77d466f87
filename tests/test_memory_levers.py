"""The tensor-by-tensor count of a step's memory (train.engine.memory) agrees with what autograd saves."""

from __future__ import annotations

import torch

from train.engine.memory import LiveTensors, storage_bytes
from train.model import XLNetConfig, XLNetForQuestionAnswering

B, T = 2, 24


def qa_batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, 10:-1] = 1
    types[:, -1] = 2
    return {
        "input_ids": torch.randint(9, vocab, (B, T), generator=g),
        "token_type_ids": types,
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "start_positions": torch.tensor([3, 0]),
        "end_positions": torch.tensor([5, 0]),
        "is_impossible": torch.tensor([0.0, 1.0]),
    }


def test_live_tensors_count_what_autograd_saves_then_the_gradients() -> None:
    """Two instruments agree: at the end of forward the live bytes are the saved-tensor hooks' bytes
    (less the batch, which existed before) plus the loss; after backward, the gradients."""
    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=1000, n_layer=2, dropout=0.1)
    model = XLNetForQuestionAnswering(config, head="beam").train()
    batch = qa_batch(config.vocab_size)
    outside = {id(t.untyped_storage()) for t in [*model.parameters(), *batch.values()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if id(st) not in outside:
            saved[id(st)] = st.nbytes()
        return t

    tracker = LiveTensors()
    with tracker:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(**batch).loss
        assert tracker.current == sum(saved.values()) + storage_bytes([loss])
        loss.backward()
        del loss
        assert tracker.current == storage_bytes(p.grad for p in model.parameters())
    assert tracker.peak >= sum(saved.values())
