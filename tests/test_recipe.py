"""The fine-tuning/pretraining recipe equals the original XLNet's, each point against a reference
computation written from the original's formulas (model_utils.get_train_op, function_builder.get_qa_outputs,
modeling._cache_mem, xlnet.create_run_config, scripts/*.sh + run_squad.py flags)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from paths import SAMPLE
from sample_cuts import first_article_split

from train.engine.optim import (
    MicroBatchClipping,
    XLNetAdam,
    clip_by_global_norm,
    lr_lambda,
    make_optimizer,
    make_scheduler,
    optimizer_step,
    param_groups,
)
from train.engine.state import latest_checkpoint, load_training_state, save_training_state
from train.finetune import main as finetune_main
from train.finetune import parse_config
from train.model import XLNetConfig, XLNetForQuestionAnswering, XLNetModel, checkpoint
from train.model.heads import apply_p_mask
from train.pretrain import main as pretrain_main
from train.recipes.finetune_setup import micro_batch_size, resolve_grad_accum

N_LAYER = 3


def tiny_qa(head: str = "beam", **kw) -> XLNetForQuestionAnswering:
    torch.manual_seed(0)
    cfg = XLNetConfig.preset("tiny", vocab_size=60, n_layer=N_LAYER, dropout=0.0, **kw)
    return XLNetForQuestionAnswering(cfg, head=head)


def original_layer_multiplier(name: str, n_layer: int, rate: float) -> float:
    """model_utils.get_train_op: variables under model/transformer/layer_<l>/ get rate^(n_layer-1-l).

    Translated to our (HF) names: the original keeps r_w/r_r/r_s biases and seg_embed as stacked
    [n_layer, ...] variables at model/transformer/, outside any layer_<l> scope.
    """
    parts = name.split(".")
    if parts[:2] != ["transformer", "layer"]:
        return 1.0
    if parts[-1] in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
        return 1.0
    return rate ** (n_layer - 1 - int(parts[2]))


def set_random_grads(model, seed: int, scale: float) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=g) * scale
            grads[name] = p.grad.double().numpy().copy()
    return grads


# ---------------------------------------------------------------- optimiser (model_utils.get_train_op)
@pytest.mark.parametrize("grad_scale", [1.0, 1e-5], ids=["normal-grads", "tiny-grads-near-eps"])
def test_one_step_equals_the_originals_clip_layer_decay_and_tf_adam(grad_scale):
    """Two steps of clip -> x rate^(n-1-l) -> tf.train.AdamOptimizer, per parameter, by hand in float64."""
    model = tiny_qa()
    lr, eps, rate, clip = 1e-3, 1e-6, 0.75, 1.0
    b1, b2 = 0.9, 0.999
    opt = make_optimizer(model, lr=lr, weight_decay=0.0, layer_decay=rate, eps=eps)
    assert isinstance(opt, XLNetAdam)
    params = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    m = {n: np.zeros_like(v) for n, v in params.items()}
    v = {n: np.zeros_like(x) for n, x in params.items()}
    for t in (1, 2):
        grads = set_random_grads(model, seed=t, scale=grad_scale)
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads.values()))
        if grad_scale == 1.0:
            assert norm > clip  # the clip is active in this case
        factor = clip / max(norm, clip)  # tf.clip_by_global_norm
        optimizer_step(opt, None, clip)
        lr_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)  # TF Adam's bias correction, eps on raw sqrt(v)
        for name, p in model.named_parameters():
            g = grads[name] * factor * original_layer_multiplier(name, N_LAYER, rate)
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g * g
            params[name] = params[name] - lr_t * m[name] / (np.sqrt(v[name]) + eps)
            got = p.detach().double().numpy()
            assert np.allclose(got, params[name], rtol=1e-5, atol=1e-9), name


def test_weight_decay_path_is_the_originals_adam_weight_decay_optimizer():
    """weight_decay > 0: no bias correction, p -= lr * (m/(sqrt(v)+eps) + wd*p), with the original's name rules."""
    model = tiny_qa()
    lr, eps, wd = 1e-2, 1e-6, 0.1
    opt = make_optimizer(model, lr=lr, weight_decay=wd, eps=eps)
    before = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    grads = set_random_grads(model, seed=3, scale=1e-3)
    optimizer_step(opt, None, clip=0.0)  # clip 0 = off
    for name, p in model.named_parameters():
        g = grads[name]
        m, v = 0.1 * g, 0.001 * g * g
        update = m / (np.sqrt(v) + eps)
        excluded = any(k in name for k in ("LayerNorm", "layer_norm", "bias"))
        forced = any(k in name for k in ("r_s_bias", "r_r_bias", "r_w_bias"))
        if forced or not excluded:
            update = update + wd * before[name]
        assert np.allclose(p.detach().double().numpy(), before[name] - lr * update, rtol=1e-5, atol=1e-8), (
            name
        )


def test_layer_decay_touches_exactly_the_originals_layer_variables():
    model = tiny_qa()
    groups = param_groups(model, lr=1.0, weight_decay=0.0, layer_decay=0.5)
    scale = {n: g["grad_scale"] for g in groups for n in g["names"]}
    assert scale == {
        n: original_layer_multiplier(n, N_LAYER, 0.5) for n, p in model.named_parameters() if p.requires_grad
    }
    assert scale["transformer.layer.2.ff.layer_1.weight"] == 1.0  # top layer x1
    assert scale["transformer.layer.0.rel_attn.q"] == 0.25  # 0.5^(3-1-0)
    for untouched in (
        "transformer.layer.0.rel_attn.r_w_bias",
        "transformer.layer.0.rel_attn.seg_embed",
        "transformer.word_embedding.weight",
        "start_logits.dense.weight",
        "answer_class.dense_0.weight",
    ):
        assert scale[untouched] == 1.0, untouched
    assert all(g["lr"] == 1.0 for g in groups)  # the rate is on gradients, not learning rates


def test_learning_rate_variant_is_an_option_with_its_own_exponents():
    model = tiny_qa(head="shallow")
    groups = param_groups(model, lr=1.0, weight_decay=0.0, layer_decay=0.5, layer_decay_mode="learning-rate")
    rate = {n: g["lr"] for g in groups for n in g["names"]}
    assert rate["start_head.weight"] == 1.0
    assert rate["transformer.layer.2.ff.layer_1.weight"] == 0.5
    assert rate["transformer.layer.0.ff.layer_1.weight"] == 0.125
    assert rate["transformer.word_embedding.weight"] == 0.0625
    assert rate["transformer.layer.0.rel_attn.r_w_bias"] == rate["transformer.layer.0.rel_attn.q"] == 0.125
    assert all(g["grad_scale"] == 1.0 for g in groups)


def test_adamw_option_uses_hf_scripts_decay_rules():
    model = tiny_qa()
    for optimizer, r_bias_decayed in (("xlnet", True), ("adamw", False)):
        groups = param_groups(model, lr=1.0, weight_decay=0.01, optimizer=optimizer)
        decay = {n: g["weight_decay"] for g in groups for n in g["names"]}
        assert (decay["transformer.layer.0.rel_attn.r_w_bias"] > 0) is r_bias_decayed
        assert decay["transformer.layer.0.rel_attn.q"] == 0.01
        assert decay["transformer.layer.0.ff.layer_norm.weight"] == 0.0


def test_resuming_with_another_optimizer_layout_is_a_clear_error(tmp_path):
    model = tiny_qa()
    opt = make_optimizer(model, lr=1e-3, layer_decay=0.5)
    save_training_state(tmp_path, 1, model, opt, None)
    other = make_optimizer(model, lr=1e-3, layer_decay=0.5, layer_decay_mode="learning-rate")
    with pytest.raises(ValueError, match="does not fit this run's optimizer"):
        load_training_state(latest_checkpoint(tmp_path), model, other, None)
    state = load_training_state(
        latest_checkpoint(tmp_path), model, make_optimizer(model, lr=1e-3, layer_decay=0.5), None
    )
    assert state["step"] == 1


def test_micro_batch_clipping_sums_separately_clipped_gradients():
    """The original on a TPU v3-8: each core clips its own (loss / 8) gradient, then the 8 are summed."""
    p = torch.nn.Parameter(torch.zeros(2))
    clipper = MicroBatchClipping([p], clip=1.0)
    for g in ([3.0, 4.0], [0.3, 0.4]):  # norms 5 (clipped to 1) and 0.5 (kept)
        p.grad = torch.tensor(g)
        clipper.add()
        assert p.grad is None
    assert clipper.finish() == pytest.approx(5.0)
    assert torch.allclose(p.grad, torch.tensor([0.6 + 0.3, 0.8 + 0.4]))
    unused = torch.nn.Parameter(torch.zeros(2))  # a parameter without gradients keeps none
    clipper = MicroBatchClipping([p, unused], clip=1.0)
    p.grad = torch.tensor([0.3, 0.4])
    clipper.add()
    clipper.finish()
    assert unused.grad is None and torch.allclose(p.grad, torch.tensor([0.3, 0.4]))
    # a global clip of the summed gradient (3.3, 4.4), norm 5.5, would give (0.6, 0.8) instead


def test_clip_is_tf_clip_by_global_norm():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    a.grad, b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0, 0.0, 0.0])
    assert clip_by_global_norm([a, b], 1.0) == pytest.approx(5.0)
    assert torch.equal(a.grad, torch.tensor([0.6, 0.0, 0.0])) and torch.equal(b.grad[1], torch.tensor(0.8))
    a.grad = torch.tensor([0.3, 0.0, 0.0])
    b.grad = torch.zeros(4)
    clip_by_global_norm([a, b], 1.0)  # below the clip: unchanged
    assert torch.equal(a.grad, torch.tensor([0.3, 0.0, 0.0]))


@pytest.mark.parametrize("decay,min_ratio", [("linear", 0.0), ("linear", 0.001), ("cosine", 0.1)])
def test_schedule_is_the_originals_warmup_then_decay(decay, min_ratio):
    """lr at global_step s: s/warmup*lr while s < warmup, then tf.train.polynomial_decay / cosine_decay."""
    total, warmup, lr = 20, 5, 2.0

    def original(s: int) -> float:
        if s < warmup:
            return s / warmup * lr
        k = min(s - warmup, total - warmup) / (total - warmup)
        if decay == "linear":
            return (lr - lr * min_ratio) * (1 - k) + lr * min_ratio
        return lr * ((1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * k)) + min_ratio)

    fn = lr_lambda(total, warmup, decay, min_ratio)
    assert [lr * fn(s) for s in range(total + 3)] == pytest.approx([original(s) for s in range(total + 3)])
    # and the k-th optimizer step (0-based) really runs at the original's lr(k)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = make_scheduler(opt, total, warmup, decay, min_ratio)
    used = []
    for _ in range(total):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert used == pytest.approx([original(s) for s in range(total)])


# ---------------------------------------------------------------- answer class (function_builder.py)
def test_answer_class_reads_the_softmax_weighted_state_in_training_and_inference():
    model = tiny_qa()
    assert model.config.answer_class_input == "softmax_start"
    model.train()  # dropout is 0 in this config, so train and eval compute the same function
    ids = torch.randint(10, 60, (2, 12))
    types = torch.zeros(2, 12, dtype=torch.long)
    types[:, 7:] = 1
    types[:, -1] = 2
    p_mask = (types != 0).float()
    p_mask[:, -1] = 0.0
    seen = {}
    model.answer_class.register_forward_hook(lambda mod, inp, out: seen.update(start=inp[0], logits=out))
    starts, ends = torch.tensor([2, 11]), torch.tensor([4, 11])
    out = model(
        ids,
        token_type_ids=types,
        p_mask=p_mask,
        start_positions=starts,
        end_positions=ends,
        is_impossible=torch.tensor([0.0, 1.0]),
    )
    hidden = model.transformer(ids, token_type_ids=types, use_mems=False).last_hidden_state
    start_logits = apply_p_mask(model.start_logits.dense(hidden).squeeze(-1), p_mask)
    expected = torch.einsum("bt,btd->bd", torch.softmax(start_logits, -1), hidden)
    assert torch.allclose(seen["start"], expected, atol=1e-6)
    # the unanswerable row's input is not the <cls> state the gold label points at
    assert not torch.allclose(seen["start"][1], hidden[1, 11], atol=1e-3)
    train_cls = out.cls_logits
    model.eval()
    with torch.no_grad():
        infer = model(ids, token_type_ids=types, p_mask=p_mask)
    assert torch.allclose(train_cls, infer.cls_logits, atol=1e-5)  # the threshold's score is the same


def test_answer_class_dropout_is_the_originals_and_hf_option_has_none():
    cfg = XLNetConfig.preset("tiny", vocab_size=60, dropout=0.1)
    assert XLNetForQuestionAnswering(cfg, head="beam").answer_class.dropout.p == 0.1
    hf_style = XLNetForQuestionAnswering(cfg.replace(answer_class_input="gold_start"), head="beam")
    assert hf_style.answer_class.dropout.p == 0.0
    with pytest.raises(ValueError, match="answer_class_input"):
        cfg.replace(answer_class_input="cls")


# ---------------------------------------------------------------- run config (xlnet.create_run_config)
def test_mem_len_zero_or_none_returns_no_memory():
    """modeling._cache_mem returns None when mem_len is None or 0 (HF would return every state)."""
    ids = torch.randint(10, 60, (2, 6))
    for mem_len in (None, 0):
        torch.manual_seed(0)
        model = XLNetModel(XLNetConfig.preset("tiny", vocab_size=60, mem_len=mem_len)).eval()
        assert model(ids, use_mems=True).mems is None
    model = XLNetModel(XLNetConfig.preset("tiny", vocab_size=60, mem_len=4, reuse_len=3)).eval()
    mems = model(ids, use_mems=True).mems
    assert len(mems) == 2 and mems[0].shape == (3, 2, 64)
    assert model(ids, mems=mems, use_mems=True).mems[0].shape == (4, 2, 64)


@pytest.fixture(scope="module")
def bi_data_pretrained(spm_dir, tmp_path_factory):
    """A real pretraining run with every pretraining-only setting on."""
    out = tmp_path_factory.mktemp("bidata") / "pre"
    args = ["--corpus", str(SAMPLE / "corpus.json"), "--spm", str(spm_dir), "--config", "tiny"]
    args += ["--steps", "2", "--batch-size", "2", "--seq-len", "32", "--reuse-len", "16", "--mem-len", "16"]
    args += ["--bi-data", "--out", str(out), "--no-progress", "--save-every", "100"]
    assert pretrain_main(args) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["bi_data"] is True and saved["mem_len"] == 16 and saved["reuse_len"] == 16
    return out


@pytest.fixture(scope="module")
def tiny_squad(tmp_path_factory):
    return first_article_split(tmp_path_factory.mktemp("squad"), 2, 1)


WINDOWS = ["--max-seq-len", "64", "--doc-stride", "32", "--max-query-len", "16", "--no-progress"]


def test_bi_data_checkpoint_fine_tunes_with_batch_one_and_identical_rows_agree(
    bi_data_pretrained, tiny_squad, tmp_path
):
    loaded = checkpoint.load(bi_data_pretrained, head="beam")
    cfg = loaded.model.config
    assert (cfg.bi_data, cfg.mem_len, cfg.reuse_len, cfg.same_length) == (False, None, None, False)
    model = loaded.model.eval()
    row = torch.randint(10, 100, (1, 20))
    types = torch.zeros(1, 20, dtype=torch.long)
    types[:, -1] = 2
    with torch.no_grad():
        one = model(row, token_type_ids=types)
        two = model(row.repeat(2, 1), token_type_ids=types.repeat(2, 1))
    assert torch.allclose(two.start_logits[0], two.start_logits[1], atol=1e-6)
    assert torch.allclose(one.start_logits[0], two.start_logits[0], atol=1e-5)
    assert one.mems is None
    train_file, dev_file = tiny_squad
    out = tmp_path / "ft"
    args = ["--train-file", str(train_file), "--dev-file", str(dev_file), "--init", str(bi_data_pretrained)]
    args += ["--head", "beam", "--batch-size", "1", "--steps", "3", "--out", str(out), *WINDOWS]
    args += ["--grad-accum", "2", "--clip-each-micro-batch"]
    assert finetune_main(args) == 0
    saved = checkpoint.load(out)
    assert saved.config.bi_data is False and saved.metadata["step"] == 3


# ---------------------------------------------------------------- evaluation protocol
def test_out_holds_the_final_model_and_best_is_labelled_with_its_selection_data(
    tiny_squad,
    spm_dir,
    tmp_path,
    capsys,
):
    train_file, dev_file = tiny_squad
    out = tmp_path / "run"
    args = ["--train-file", str(train_file), "--dev-file", str(dev_file), "--config", "tiny", "--spm"]
    args += [str(spm_dir), "--head", "shallow", "--steps", "6", "--eval-every", "2", "--lr", "1e-3"]
    args += ["--out", str(out), "--keep-best", *WINDOWS]
    assert finetune_main(args) == 0
    final = checkpoint.load(out)
    assert final.metadata["step"] == 6 and final.metadata["threshold_selected_on"] == str(dev_file)
    best = checkpoint.load(out / "best")
    assert best.metadata["selected_on"] == str(dev_file) and best.metadata["step"] in (2, 4, 6)
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "dev_f1" in x]
    assert best.metadata["dev_metrics"]["best_f1"] == max(e["dev_best_f1"] for e in evals)
    assert final.metadata["dev_metrics"]["f1"] == evals[-1]["dev_f1"]
    printed = capsys.readouterr().out
    assert "Final model in" in printed and f"selected on {dev_file}" in printed


# ---------------------------------------------------------------- published-run presets
def test_recipes_hold_the_original_scripts_values(tiny_squad):
    train_file, dev_file = tiny_squad
    base = ["--train-file", str(train_file), "--dev-file", str(dev_file), "--out", "x", "--init", "y"]
    large = parse_config(["--recipe", "xlnet-squad-large", *base])
    # scripts/tpu_squad_large.sh + run_squad.py flag defaults
    m = large.model
    assert (m.max_seq_len, m.doc_stride, m.max_query_len, m.max_answer_len) == (
        512,
        128,
        64,
        64,
    )
    assert (large.head, large.start_n_top, large.end_n_top, m.n_best) == ("beam", 5, 5, 5)
    assert (large.global_batch_size, large.lr, large.steps, large.warmup) == (48, 3e-5, 8000, 1000)
    assert (large.adam_eps, large.weight_decay, large.clip, large.min_lr_ratio) == (1e-6, 0.0, 1.0, 0.0)
    assert (large.layer_decay, large.layer_decay_on, large.optimizer) == (0.75, "gradients", "xlnet")
    assert (large.answer_class_input, large.decay, large.dropout) == ("softmax_start", "linear", 0.1)
    assert large.clip_each_micro_batch  # 8 TPU cores, each clipping its own gradient:
    assert [resolve_grad_accum(large, world) for world in (1, 2, 4, 8)] == [8, 4, 2, 1]
    with pytest.raises(ValueError, match="cannot split"):
        resolve_grad_accum(large, 3)
    # scripts/gpu_squad_base.sh: 3 GPUs x 8, lr 2e-5, 12,000 steps
    base_run = parse_config(["--recipe", "xlnet-squad-base", *base])
    assert (base_run.global_batch_size, base_run.lr, base_run.steps) == (24, 2e-5, 12000)
    assert resolve_grad_accum(base_run, 1) == 3 and micro_batch_size(base_run, 3) == 8
    assert (large.eval_every, base_run.eval_every) == (8000, 12000)  # one prediction, after training
    assert parse_config(["--recipe", "xlnet-squad-base", "--epochs", "1", *base]).steps is None
    # explicit flags win; the global batch splits over ranks and accumulation
    assert micro_batch_size(large, world_size=1) == 6  # one TPU core's share per micro-batch
    assert parse_config(base).answer_class_input is None  # without a recipe a checkpoint keeps its own
    mine = parse_config(["--recipe", "xlnet-squad-large", "--lr", "1e-5", "--grad-accum", "4", *base])
    assert mine.lr == 1e-5 and micro_batch_size(mine, world_size=2) == 6
    assert (
        micro_batch_size(parse_config(["--recipe", "xlnet-squad-large", "--batch-size", "4", *base]), 1) == 4
    )
    with pytest.raises(ValueError, match="not divisible"):
        micro_batch_size(parse_config(["--recipe", "xlnet-squad-large", "--grad-accum", "5", *base]), 1)
    with pytest.raises(ValueError, match="not both"):
        parse_config(["--batch-size", "4", "--global-batch-size", "8", *base])
