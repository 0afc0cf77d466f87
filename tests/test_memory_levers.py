"""Frozen layers keep no activations once nothing below them trains, and the tensor-by-tensor count of
a step's memory (train.engine.memory) agrees with what autograd saves."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from train.engine.memory import LiveTensors, storage_bytes
from train.model import XLNetConfig, XLNetForQuestionAnswering
from train.recipes.finetune_setup import freeze, trained_through_frozen

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


def gradients_of(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], seed: int) -> dict:
    """The loss and every gradient of one backward, dropout drawn from `seed`."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = loss_fn()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.detach(), **grads}


def max_delta(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def saved_bytes_by_layer(model: XLNetForQuestionAnswering, loss_fn) -> dict[str, int]:
    """What autograd saves for backward (saved-tensor hooks), by the layer that saves it ("other":
    embedding and head); parameters and the batch are not counted (they are held anyway)."""
    held = {id(t.untyped_storage()) for t in model.parameters()}
    where = {"now": "other"}
    saved: dict[str, dict[int, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if id(st) not in held:
            saved.setdefault(where["now"], {})[id(st)] = st.nbytes()
        return t

    hooks = []
    for i, layer in enumerate(model.transformer.layer):
        hooks.append(layer.register_forward_pre_hook(lambda *_, i=i: where.update(now=f"layer {i}")))
        hooks.append(layer.register_forward_hook(lambda *_: where.update(now="other")))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn()
    for h in hooks:
        h.remove()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return {k: sum(v.values()) for k, v in saved.items()}


def test_frozen_layers_keep_no_activations_and_the_trained_layers_the_same_gradients() -> None:
    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=1000, n_layer=4, dropout=0.1)
    full = XLNetForQuestionAnswering(config, head="shallow").train()
    frozen = copy.deepcopy(full)
    freeze(full, 0, embeddings=False)  # what fine-tuning does without freezing (mask_emb unused)
    freeze(frozen, 2, embeddings=True)
    batch = qa_batch(config.vocab_size)

    saved_full = saved_bytes_by_layer(full, lambda: full(**batch).loss)
    saved_frozen = saved_bytes_by_layer(frozen, lambda: frozen(**batch).loss)
    assert "layer 0" not in saved_frozen and "layer 1" not in saved_frozen  # nothing saved at all
    assert saved_full["layer 0"] > 0 and saved_full["layer 1"] > 0
    for k in ("layer 2", "layer 3"):
        assert saved_frozen[k] == saved_full[k]
    assert trained_through_frozen(frozen, 2) == []

    a = gradients_of(full, lambda: full(**batch).loss, seed=1)
    b = gradients_of(frozen, lambda: frozen(**batch).loss, seed=1)
    assert torch.equal(a["loss"], b["loss"])  # the same outputs
    trained = {
        k for k in a if k == "loss" or not k.startswith(("transformer.layer.0.", "transformer.layer.1."))
    }
    assert set(b) == trained - {"transformer.word_embedding.weight"}
    assert max_delta({k: a[k] for k in b}, b) == 0.0

    peaks = {}
    for name, model in (("full", full), ("frozen", frozen)):
        tracker = LiveTensors()
        with tracker:
            model(**batch).loss.backward()
        model.zero_grad(set_to_none=True)
        peaks[name] = tracker.peak
    assert peaks["frozen"] < peaks["full"]


def test_frozen_layers_under_a_trained_embedding_keep_what_its_gradient_needs() -> None:
    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=1000, n_layer=4, dropout=0.1)
    model = XLNetForQuestionAnswering(config, head="shallow").train()
    freeze(model, 2, embeddings=False)
    batch = qa_batch(config.vocab_size)
    saved = saved_bytes_by_layer(model, lambda: model(**batch).loss)
    assert saved["layer 0"] > 0 and saved["layer 1"] > 0
    assert saved["layer 0"] < saved["layer 3"]  # no weight gradients: only the input gradients' share
    assert trained_through_frozen(model, 2) == ["word_embedding.weight"]
    tied = XLNetForQuestionAnswering(config.replace(untie_r=False), head="shallow")
    freeze(tied, 2, embeddings=True)
    assert trained_through_frozen(tied, 2) == [
        "layer.0.rel_attn.r_r_bias",
        "layer.0.rel_attn.r_s_bias",
        "layer.0.rel_attn.r_w_bias",
    ]


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
