"""The shared training step: accumulation, non-finite gradients caught before the optimizer, precision
rules, and checkpoints that refuse non-finite weights. A tiny real XLNet QA model and the project's own
optimizer and schedule; faults are injected through gradient hooks (finite loss, infinite gradient)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gpu_mode import REQUIRE_ENV, require_torch_cuda

from train.engine.execution import Dist
from train.engine.optim import make_optimizer, make_scheduler
from train.engine.state import latest_checkpoint, save_training_state
from train.engine.step import NonFiniteGradients, TrainStep
from train.model import XLNetConfig, XLNetForQuestionAnswering

SEQ, BATCH = 24, 4


def tiny_setup(seed: int = 0, **step_kw) -> tuple[XLNetForQuestionAnswering, TrainStep]:
    torch.manual_seed(seed)
    model = XLNetForQuestionAnswering(XLNetConfig.preset("tiny", vocab_size=200, dropout=0.0), head="shallow")
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.01)
    scheduler = make_scheduler(optimizer, 100, 0)
    return model, TrainStep(model, optimizer, scheduler, dist=Dist(), **step_kw)


def batch(seed: int, n: int = BATCH) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(5, 200, (n, SEQ), generator=g),
        "start_positions": torch.randint(0, SEQ, (n,), generator=g),
        "end_positions": torch.randint(0, SEQ, (n,), generator=g),
    }


def loss_of(rows: dict[str, torch.Tensor]):
    def micro(model: torch.nn.Module, i: int) -> torch.Tensor:
        n = len(rows["input_ids"]) // micro.parts
        part = {k: v[i * n : (i + 1) * n] for k, v in rows.items()}
        return model(
            part["input_ids"], start_positions=part["start_positions"], end_positions=part["end_positions"]
        ).loss

    micro.parts = 1
    return micro


def poison(model: torch.nn.Module, value: float):
    """Multiply the word-embedding gradient by ``value`` (inf, nan): a finite loss, a broken gradient."""
    return model.transformer.word_embedding.weight.register_hook(lambda g: g * value)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_accumulated_micro_batches_equal_one_full_batch() -> None:
    whole_model, whole = tiny_setup()
    split_model, split = tiny_setup(grad_accum=2)
    rows = batch(1)
    one = whole.step(loss_of(rows))
    halves = loss_of(rows)
    halves.parts = 2
    two = split.step(halves)
    assert one.grad_norm == pytest.approx(two.grad_norm, rel=1e-4)
    for (name, a), b in zip(whole_model.state_dict().items(), split_model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_an_infinite_gradient_skips_the_step_and_touches_nothing() -> None:
    model, trainer = tiny_setup(max_bad_steps=3)
    trainer.step(loss_of(batch(1)))  # a normal step: optimizer state exists
    before = weights(model)
    lr_before = trainer.scheduler.get_last_lr()
    moments = [
        {k: torch.as_tensor(v).clone() for k, v in st.items()} for st in trainer.optimizer.state.values()
    ]
    hook = poison(model, float("inf"))
    outcome = trainer.step(loss_of(batch(2)))
    assert outcome.skipped and outcome.loss == outcome.loss and abs(outcome.loss) < 1e3  # the loss was finite
    assert trainer.skipped_total == 1 and trainer.skipped_in_row == 1
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed in a skipped step"
    assert trainer.scheduler.get_last_lr() == lr_before
    for state, saved in zip(trainer.optimizer.state.values(), moments, strict=True):
        assert all(torch.equal(torch.as_tensor(state[k]), torch.as_tensor(v)) for k, v in saved.items())
    assert all(p.grad is None for p in model.parameters())  # nothing carried into the next step
    hook.remove()
    assert not trainer.step(loss_of(batch(3))).skipped and trainer.skipped_in_row == 0
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_consecutive_non_finite_steps_stop_the_run_with_finite_weights() -> None:
    model, trainer = tiny_setup(max_bad_steps=3)
    poison(model, float("nan"))
    trainer.step(loss_of(batch(1)))
    trainer.step(loss_of(batch(2)))
    with pytest.raises(NonFiniteGradients, match="3 steps in a row"):
        trainer.step(loss_of(batch(3)))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_checkpoint_is_never_written_with_non_finite_weights(tmp_path: Path) -> None:
    model, trainer = tiny_setup()
    trainer.step(loss_of(batch(1)))
    good = save_training_state(tmp_path, 1, model, trainer.optimizer, trainer.scheduler)
    with torch.no_grad():
        next(model.parameters())[0].fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="non-finite"):
        save_training_state(tmp_path, 2, model, trainer.optimizer, trainer.scheduler)
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", good.name]


def test_precision_rules() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        tiny_setup(precision="fp16")  # fp16 autocast on CPU: refused before any work
    with pytest.raises(ValueError, match="precision"):
        tiny_setup(precision="fp8")
    model, trainer = tiny_setup(precision="bf16")
    assert not trainer.scaler.is_enabled()  # bf16 needs no loss scaling
    outcome = trainer.step(loss_of(batch(1)))
    assert not outcome.skipped and torch.isfinite(torch.tensor(outcome.grad_norm))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_the_cuda_gate_names_a_missing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU venv without torch skips (or, when the GPU tests are required, fails) saying so, rather than
    reading as 'no GPU here'."""
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="torch is not installed"):
        require_torch_cuda()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV}=1 but torch is not installed"):
        require_torch_cuda()


def cuda_setup(precision: str) -> tuple[XLNetForQuestionAnswering, TrainStep, dict[str, torch.Tensor]]:
    """The tiny model, its step and one batch on the CUDA device (the GPU tests' gate passed)."""
    torch.manual_seed(0)
    model = XLNetForQuestionAnswering(
        XLNetConfig.preset("tiny", vocab_size=200, dropout=0.0), head="shallow"
    ).cuda()
    optimizer = make_optimizer(model, lr=1e-3, weight_decay=0.01)
    trainer = TrainStep(model, optimizer, None, dist=Dist(device=torch.device("cuda")), precision=precision)
    return model, trainer, {k: v.cuda() for k, v in batch(1).items()}


@pytest.mark.gpu
def test_fp16_uses_a_loss_scaler_that_backs_off_on_overflow() -> None:
    require_torch_cuda()
    model, trainer, rows = cuda_setup("fp16")
    scale = trainer.scaler.get_scale()
    hook = poison(model, float("inf"))
    assert trainer.step(loss_of(rows)).skipped
    assert trainer.scaler.get_scale() < scale
    hook.remove()
    assert not trainer.step(loss_of(rows)).skipped


@pytest.mark.gpu
def test_bf16_on_cuda_autocasts_without_a_scaler_and_keeps_fp32_master_weights() -> None:
    """The CUDA counterpart of the CPU bf16 rule: the forward really runs in bf16 on the GPU, the step
    needs no loss scaling, updates fp32 weights, and an infinite gradient still skips it."""
    require_torch_cuda()
    if not torch.cuda.is_bf16_supported():
        pytest.skip(f"{torch.cuda.get_device_name()} has no bfloat16 support")
    model, trainer, rows = cuda_setup("bf16")
    assert not trainer.scaler.is_enabled()
    seen: list[torch.dtype] = []
    watch = model.start_head.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    before = weights(model)
    outcome = trainer.step(loss_of(rows))
    watch.remove()
    assert seen == [torch.bfloat16]  # autocast on the CUDA device, not a silent fp32 run
    assert not outcome.skipped and torch.isfinite(torch.tensor([outcome.loss, outcome.grad_norm])).all()
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    after = weights(model)
    hook = poison(model, float("inf"))
    assert trainer.step(loss_of(rows)).skipped
    hook.remove()
    assert all(torch.equal(v, after[k]) for k, v in model.state_dict().items())


def test_a_nan_in_a_later_micro_batch_is_caught_with_per_micro_batch_clipping() -> None:
    """Per-micro-batch clipping reports the largest micro-batch norm, and max() skips NaN: the step
    must still see the NaN gradient of the second micro-batch and skip."""
    model, trainer = tiny_setup(grad_accum=2, clip_each_micro_batch=True)
    calls = {"n": 0}

    def nan_on_second(g: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return g * float("nan") if calls["n"] == 2 else g

    before = weights(model)
    hook = model.transformer.word_embedding.weight.register_hook(nan_on_second)
    micro = loss_of(batch(1))
    micro.parts = 2
    assert trainer.step(micro).skipped and calls["n"] == 2
    hook.remove()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_run_off_cuda_reports_no_gpu_peak() -> None:
    from train.engine.memory import gpu_peak_line

    assert gpu_peak_line(torch.device("cpu")) is None


@pytest.mark.gpu
def test_the_gpu_peak_line_is_the_allocators_own_peak_after_a_step() -> None:
    """The line a run prints at its end on CUDA: the allocator's peak over the run, in GiB."""
    from train.engine.memory import gpu_peak_line

    require_torch_cuda()
    torch.cuda.reset_peak_memory_stats()
    _, trainer, rows = cuda_setup("fp32")
    trainer.step(loss_of(rows))
    line = gpu_peak_line(torch.device("cuda"))
    assert line is not None and line.startswith("Peak GPU memory on cuda")
    allocated = float(line.split(": ")[1].split(" GiB allocated")[0])
    assert allocated > 0 and abs(allocated - torch.cuda.max_memory_allocated() / 2**30) < 0.01
