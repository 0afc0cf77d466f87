"""The fused attention kernel (train/model/triton_attention.py) against the torch formulation: run by
Triton's interpreter on the CPU (fp32 and fp16; the interpreter's bf16 arithmetic is not the GPU's, so
bf16 is checked on a GPU only), and compiled on a CUDA device (fp32, fp16, bf16) where there is one:
the same scores, softmax and values at shapes the blocks do not divide, with padded keys."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gpu_mode import require_package, require_torch_cuda
from paths import REPO

CHECK = r"""
import sys
import torch
from train.model.fused import FusedInputs, position_chunks, position_scores
from train.model.triton_attention import relative_attention

device = sys.argv[1]
half = [torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
torch.manual_seed(0)
worst = {}
for dtype in [torch.float32, *half]:
    for b, t, n, width, dh, block in ((1, 5, 2, 72, 64, 16), (2, 37, 3, 72, 32, 16), (1, 70, 2, 24, 16, 32)):
        q = torch.randn(b, t, n, width)
        k = torch.randn(b, t, n, width)
        v = torch.randn(b, t, n, dh)
        k[1 if b > 1 else 0, -3:, :, width - 1] = -1e30 if dtype == torch.float32 else -3e4  # padded keys
        q[..., width - 1] = 1.0
        table = torch.randn(1, n, 2 * 80, width)  # distances 80 .. -79, the window's are the middle 2T
        plan = FusedInputs(b, t, torch.empty(0), torch.empty(0), position_chunks(t, 160, 1), 80 - t)
        qh, kh, vh = q.transpose(1, 2), k.permute(0, 2, 3, 1), v.transpose(1, 2)
        want = torch.softmax(qh @ kh + position_scores(qh, table, plan, n), -1) @ vh
        distances = qh @ table[:, :, 80 - t : 80 + t].transpose(-1, -2)
        cast = [x.to(device, dtype) for x in (q, k, v, distances)]
        got = relative_attention(*cast, block=block)
        assert got.shape == (b, t, n, dh) and got.dtype == dtype
        err = (got.float().cpu().transpose(1, 2) - want).abs().max().item()
        worst[str(dtype)] = max(worst.get(str(dtype), 0.0), err)
assert worst["torch.float32"] < 1e-4, worst
assert all(worst[str(d)] < (0.02 if d == torch.float16 else 0.1) for d in half), worst
try:
    relative_attention(*(x.to(device) for x in (q, k[:, :-1], v, distances)))
except ValueError as exc:
    assert "disagree" in str(exc)
else:
    raise AssertionError("mismatched shapes were accepted")
# The whole model: QAInference runs the kernel (on a GPU, or here under the interpreter) and answers
# as the reference layers do at every real token.
import copy
from train.model import XLNetConfig, XLNetForQuestionAnswering
from train.model.inference import QAInference
from train.model import triton_attention

config = XLNetConfig(vocab_size=60, d_model=32, n_layer=2, n_head=2, d_inner=64, dropout=0.0)  # d_head 16
model = XLNetForQuestionAnswering(config, head="shallow").eval()
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.3)
reference = QAInference(copy.deepcopy(model), max_positions=None)
fused = QAInference(model).to(device)
ids = torch.randint(9, 60, (2, 23))
types = torch.zeros(2, 23, dtype=torch.long)
types[:, 15:21], types[:, 21], types[:, 22:] = 1, 2, 3
types[1, 10:14], types[1, 14], types[1, 15:] = 1, 2, 3  # a shorter window, padded after its <cls>
mask = (types != 3).long()
assert triton_attention.wanted(torch.empty(0, device=device), 16)
with torch.no_grad():
    want = reference(ids, mask, types)
    got = fused(ids.to(device), mask.to(device), types.to(device))
for name, w_, g_ in zip(reference.names, want, got):
    g_ = g_.cpu()
    if w_.dim() == 2:
        w_, g_ = w_[mask.bool()], g_[mask.bool()]
    assert (w_ - g_).abs().max() < 1e-4, (name, (w_ - g_).abs().max())
print("ok", worst)
"""


def check(device: str, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, device], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout + proc.stderr[-3000:]


def test_the_kernel_equals_the_torch_formulation_under_the_interpreter() -> None:
    pytest.importorskip("triton", reason="triton is in the test-tools extra (pyproject); a GPU image has it")
    check("cpu", {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)})


@pytest.mark.gpu
def test_the_kernel_compiled_on_a_gpu_equals_the_torch_formulation() -> None:
    require_torch_cuda()
    require_package("triton", "triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    check("cuda", {**env, "PYTHONPATH": str(REPO)})


def test_the_offset_guard_splits_a_batch_past_32_bit_offsets() -> None:
    """xlnet-base at T 384 (12 heads, the fused width 72, position scores [B, 12, T, 2T]): 606 rows fit
    the kernel's int32 offsets and 607 do not (batch x heads x 2T^2 >= 2^31; shapes only: meta tensors, no memory). Past it the batch
    runs in slices that each fit, covering every row once; one row too long for any slice is refused."""
    import torch

    from train.model.triton_attention import OFFSET_LIMIT, batch_slices, largest_offset

    def operands(rows: int, length: int = 384, heads: int = 12) -> tuple[torch.Tensor, ...]:
        q = torch.empty(rows, length, heads, 72, device="meta", dtype=torch.float16)
        v = torch.empty(rows, length, heads, 64, device="meta", dtype=torch.float16)
        distances = torch.empty(rows, heads, length, 2 * length, device="meta", dtype=torch.float16)
        return q, q, v, distances

    assert largest_offset(606, *operands(606)) <= OFFSET_LIMIT < largest_offset(607, *operands(607))
    assert batch_slices(606, operands(606)) == [slice(0, 606)]
    for rows in (607, 1000, 4096):
        tensors = operands(rows)
        slices = batch_slices(rows, tensors)
        assert len(slices) > 1 and slices[0].start == 0 and slices[-1].stop == rows
        assert all(a.stop == b.start for a, b in zip(slices, slices[1:], strict=False))
        assert all(largest_offset(s.stop - s.start, *tensors) <= OFFSET_LIMIT for s in slices)
    with pytest.raises(ValueError, match="too long"):
        batch_slices(1, operands(1, length=12_000))


SPLIT_CHECK = r"""
import torch
from train.model.triton_attention import batch_slices, relative_attention
torch.manual_seed(0)
b, t, n, width, dh = 5, 20, 2, 24, 16
q, k = torch.randn(b, t, n, width), torch.randn(b, t, n, width)
v, distances = torch.randn(b, t, n, dh), torch.randn(b, n, t, 2 * t)
whole = relative_attention(q, k, v, distances, block=16)
limit = 2 * n * t * 2 * t  # two rows of position scores fit, three do not
assert len(batch_slices(b, (q, k, v, distances), limit)) == 3
split = relative_attention(q, k, v, distances, block=16, offset_limit=limit)
assert torch.equal(whole, split), (whole - split).abs().max()
print("ok")
"""


def test_a_split_batch_gives_the_kernel_s_own_answer_under_the_interpreter() -> None:
    """The guard's slices, forced by a small limit, run the kernel per slice: bit for bit the unsplit
    result (the slices' views keep the operands' strides)."""
    pytest.importorskip("triton", reason="triton is in the test-tools extra (pyproject); a GPU image has it")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", SPLIT_CHECK], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout + proc.stderr[-3000:]
