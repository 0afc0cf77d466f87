"""The memory levers: activation checkpointing gives the gradients of the plain model (dropout on, both
streams and memory in pretraining), frozen layers keep no activations once nothing below them trains,
and the tensor-by-tensor count (train.engine.memory) agrees with what autograd saves."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fixtures_spm import TINY_PRETRAIN_ARGS
from paths import SAMPLE

from qa_core.squad import write_squad
from train.engine.memory import LiveTensors, storage_bytes
from train.finetune import parse_config as finetune_config
from train.model import XLNetConfig, XLNetForQuestionAnswering, XLNetLMHeadModel, checkpoint
from train.pretrain import parse_config as pretrain_config
from train.recipes.finetune import FinetuneRecipe
from train.recipes.finetune_setup import freeze, trained_through_frozen
from train.recipes.pretrain import PretrainRecipe

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


def activations_at_end_of_forward(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor]) -> int:
    tracker = LiveTensors()
    with tracker:
        loss = loss_fn()
        held = tracker.current
        loss.backward()
    model.zero_grad(set_to_none=True)
    return held


def compare_checkpointing(model, loss_fn) -> float:
    """Max |gradient difference| with and without checkpointing (same seed), after checking that
    dropout is on (another seed changes the gradients) and that checkpointing holds less."""
    model.train()
    plain = gradients_of(model, loss_fn, seed=1)
    other_masks = gradients_of(model, loss_fn, seed=2)
    assert max_delta(plain, other_masks) > 1e-4  # dropout on: equality below means the same masks
    held_plain = activations_at_end_of_forward(model, loss_fn)
    model.transformer.activation_checkpointing = True
    checkpointed = gradients_of(model, loss_fn, seed=1)
    held_checkpointed = activations_at_end_of_forward(model, loss_fn)
    model.transformer.activation_checkpointing = False
    assert held_checkpointed < 0.75 * held_plain, (held_checkpointed, held_plain)  # the head keeps its own
    return max_delta(plain, checkpointed)


@pytest.mark.parametrize("head", ["shallow", "deep", "beam"])
def test_checkpointing_gives_the_same_gradients_for_each_head(head: str) -> None:
    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=1000, n_layer=3, dropout=0.1)
    model = XLNetForQuestionAnswering(config, head=head)
    batch = qa_batch(config.vocab_size)
    delta = compare_checkpointing(model, lambda: model(**batch).loss)
    print(f"{head}: max |grad delta| with vs without checkpointing {delta:.3g}")
    assert delta <= 1e-6


def test_checkpointing_under_bf16_autocast_gives_the_same_gradients() -> None:
    """The recomputation runs under the autocast state of the forward it repeats."""
    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=1000, n_layer=3, dropout=0.1)
    model = XLNetForQuestionAnswering(config, head="beam")
    batch = qa_batch(config.vocab_size)

    def loss_fn() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(**batch).loss.float()

    delta = compare_checkpointing(model, loss_fn)
    print(f"beam, bf16 autocast: max |grad delta| with vs without checkpointing {delta:.3g}")
    assert delta <= 1e-6


def test_checkpointing_gives_the_same_gradients_and_memory_in_pretraining() -> None:
    """Both streams (perm_mask, target_mapping) and memory from a previous segment, dropout on."""
    torch.manual_seed(0)
    mem_len, p = 8, 5
    config = XLNetConfig.preset("tiny", vocab_size=1000, n_layer=3, mem_len=mem_len, reuse_len=mem_len)
    model = XLNetLMHeadModel(config)
    g = torch.Generator().manual_seed(0)
    target_mapping = torch.zeros(B, p, T)
    target_mapping[:, torch.arange(p), torch.arange(p) + 12] = 1.0
    inputs = {
        "input_ids": torch.randint(9, 1000, (B, T), generator=g),
        "token_type_ids": (torch.arange(T) >= T // 2).long().expand(B, T),
        "perm_mask": (torch.rand(B, T, T, generator=g) > 0.5).float(),
        "target_mapping": target_mapping,
        "labels": torch.randint(9, 1000, (B, p), generator=g),
        "mems": [torch.randn(mem_len, B, config.d_model, generator=g) for _ in range(config.n_layer)],
    }
    new_mems: list[list[torch.Tensor]] = []  # of each call, in compare_checkpointing's order

    def loss_fn() -> torch.Tensor:
        out = model(**inputs)
        assert out.query_hidden_state is not None and out.mems is not None
        new_mems.append(out.mems)
        return out.loss

    delta = compare_checkpointing(model, loss_fn)
    print(f"pretraining (two streams, memory): max |grad delta| with vs without checkpointing {delta:.3g}")
    assert delta <= 1e-6
    plain, checkpointed = new_mems[0], new_mems[3]  # both with seed 1
    assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed, strict=True))


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


def read_losses(out: Path) -> dict[int, float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def run_recipe(recipe_class, parse_config, argv: list[str]) -> bool:
    """Run a command's recipe; returns whether its model was checkpointing."""
    recipe = recipe_class(parse_config(argv))
    recipe.run()
    return recipe.model.transformer.activation_checkpointing


def test_pretrain_flag_trains_the_same_and_may_be_added_on_resume(spm_dir: Path, tmp_path: Path) -> None:
    """--activation-checkpointing changes memory, not the run: the same losses and weights, and a
    resume may add it (dropout on: the tiny preset's 0.1)."""
    common = [*TINY_PRETRAIN_ARGS, "--spm", str(spm_dir), "--steps", "3"]
    plain, switched = tmp_path / "plain", tmp_path / "switched"
    assert not run_recipe(PretrainRecipe, pretrain_config, [*common, "--out", str(plain)])
    assert not run_recipe(
        PretrainRecipe, pretrain_config, [*common, "--out", str(switched), "--stop-after", "2"]
    )
    resume = [*common, "--out", str(switched), "--resume", "--activation-checkpointing"]
    assert run_recipe(PretrainRecipe, pretrain_config, resume)
    assert read_losses(plain) == read_losses(switched)
    a, b = checkpoint.load(plain).model.state_dict(), checkpoint.load(switched).model.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def test_finetune_flag_trains_the_same_and_names_what_trains_through_frozen_layers(
    spm_dir: Path, tmp_path: Path, capsys
) -> None:
    train = json.loads((SAMPLE / "train.json").read_text())
    train["data"] = [{**train["data"][0], "paragraphs": train["data"][0]["paragraphs"][:2]}]
    write_squad(train, tmp_path / "train.json")
    common = [
        *("--train-file", str(tmp_path / "train.json"), "--dev-file", str(tmp_path / "train.json")),
        *("--config", "tiny", "--spm", str(spm_dir), "--head", "beam", "--freeze-layers", "1"),
        *("--steps", "2", "--eval-every", "2", "--max-dev-examples", "4", "--answerability", "cls"),
        *("--max-seq-len", "64", "--doc-stride", "32", "--max-query-len", "16", "--batch-size", "4"),
        *("--no-progress", "--seed", "1"),
    ]
    plain, checkpointed = tmp_path / "plain", tmp_path / "checkpointed"
    assert not run_recipe(FinetuneRecipe, finetune_config, [*common, "--out", str(plain)])
    argv = [*common, "--out", str(checkpointed), "--activation-checkpointing"]
    assert run_recipe(FinetuneRecipe, finetune_config, argv)
    assert (
        "gradients pass through them to word_embedding.weight (--freeze-embeddings" in capsys.readouterr().out
    )
    a, b = checkpoint.load(plain).model.state_dict(), checkpoint.load(checkpointed).model.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
