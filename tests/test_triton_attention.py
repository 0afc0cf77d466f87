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
