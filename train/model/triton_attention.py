"""One GPU kernel for the fused layer's attention: softmax(q . k + shifted position scores) @ v.

`train.model.fused` leaves, per layer, the content MatMul, the relative shift (slices of the position
product), the Add, the softmax and the values' MatMul: five or more kernels, each a pass over [B, N, T, T]
in memory. This kernel is FlashAttention's loop (key blocks streamed, the softmax kept online, nothing
[T, T] written) with XLNet's position term read in place: the score of query i and key j adds
``distances[i, T - i + j]`` of the position product ``q @ kr`` ([B, N, T, 2T], one GEMM before the
kernel), a skewed load instead of a shifted copy. It reads q, k, v where the input projection left
them ([B, T, N, E] views, any strides with a unit last one) and writes [B, T, N, Dh], the layout the
output projection reads: no transposes around it.

Triton is optional (the lent GPU machines have it; `pip install triton` elsewhere). The kernel is
tested on the CPU under ``TRITON_INTERPRET=1`` (tests/test_triton_attention.py) against the torch
formulation; the model uses it only on a CUDA device with triton importable (`available`).

The model calls it as the custom operator ``torch.ops.xlnetqa.relative_attention``: opaque to
``torch.compile``, so a compiled model keeps the kernel and Inductor fuses what lies around it (the
projections' bias and GELU, residual + LayerNorm) instead of breaking its graph twice a layer.

Its offsets are 32-bit: a batch whose largest offset into any operand would pass 2**31 - 1 elements
(xlnet-base's position scores [B, 12, T, 2T]: B >= 607 at T 384) runs in slices of the batch that stay
below it (`batch_slices`), each one launch, rather than reading wrapped addresses.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator

import torch

# XLNETQA_ATTENTION_KERNEL=torch keeps the torch formulation on a GPU too (for side-by-side timings;
# `bench.latency` flips `ENABLED` itself around a capture).
ENABLED = os.environ.get("XLNETQA_ATTENTION_KERNEL", "triton") != "torch"


@contextlib.contextmanager
def kernel(enabled: bool) -> Iterator[None]:
    """Within it the kernel is used only if ``enabled`` (and `ENABLED`): a capture or a FLOP count of the
    torch formulation on a GPU."""
    global ENABLED
    before = ENABLED
    ENABLED = before and enabled
    try:
        yield
    finally:
        ENABLED = before


@functools.cache
def available() -> bool:
    """Triton importable (the lent GPU machines' image has it; `pip install triton` elsewhere)."""
    return importlib.util.find_spec("triton") is not None


def wanted(x: torch.Tensor, d_head: int) -> bool:
    """Use the kernel for this tensor: on a CUDA device (or the CPU under Triton's interpreter), triton
    there, not traced (an export keeps the portable torch formulation), a value width the kernel's
    blocks take."""
    return (
        ENABLED
        and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")  # the interpreter: CPU tests
        and not torch.jit.is_tracing()
        and d_head >= 16
        and d_head & (d_head - 1) == 0
        and available()
    )


def _split_width(width: int) -> tuple[int, int]:
    """Two power-of-two column blocks covering ``width`` (tl.arange needs powers of two): 72 -> 64 + 16."""
    first = 1 << (width.bit_length() - 1)
    rest = width - first
    second = max(16, 1 << (rest - 1).bit_length()) if rest else 16
    return first, second


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def relative_attention_kernel(
        q_ptr, k_ptr, v_ptr, p_ptr, o_ptr,
        sq_b, sq_t, sq_n, sk_b, sk_t, sk_n, sv_b, sv_t, sv_n, sp_b, sp_n, sp_t, so_b, so_t, so_n,
        n_head, length, width,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, E1: tl.constexpr, E2: tl.constexpr,
        DV: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        row_block = tl.program_id(0)
        bn = tl.program_id(1)
        b = bn // n_head
        n = bn % n_head
        rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < length
        cols1 = tl.arange(0, E1)
        cols2 = E1 + tl.arange(0, E2)
        dv = tl.arange(0, DV)
        q_base = q_ptr + b * sq_b + n * sq_n + rows[:, None] * sq_t
        q1 = tl.load(q_base + cols1[None, :], mask=row_ok[:, None], other=0.0)
        q2 = tl.load(q_base + cols2[None, :], mask=row_ok[:, None] & (cols2[None, :] < width), other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DV], tl.float32)
        p_rows = p_ptr + b * sp_b + n * sp_n + rows[:, None] * sp_t + (length - rows[:, None])
        for start in range(0, length, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            key_ok = keys < length
            k_base = k_ptr + b * sk_b + n * sk_n + keys[None, :] * sk_t
            k1 = tl.load(k_base + cols1[:, None], mask=key_ok[None, :], other=0.0)
            k2 = tl.load(k_base + cols2[:, None], mask=key_ok[None, :] & (cols2[:, None] < width), other=0.0)
            scores = tl.dot(q1, k1, input_precision=PRECISION) + tl.dot(q2, k2, input_precision=PRECISION)
            both = row_ok[:, None] & key_ok[None, :]
            scores += tl.load(p_rows + keys[None, :], mask=both, other=0.0).to(tl.float32)
            scores = tl.where(key_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp(m_i - m_new)
            probs = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(probs, 1)
            v = tl.load(
                v_ptr + b * sv_b + n * sv_n + keys[:, None] * sv_t + dv[None, :],
                mask=key_ok[:, None],
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        out = acc / l_i[:, None]
        o_base = o_ptr + b * so_b + n * so_n + rows[:, None] * so_t + dv[None, :]
        tl.store(o_base, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])

    return relative_attention_kernel


OFFSET_LIMIT = 2**31 - 1  # the kernel's offsets are int32 (program ids times strides)


def largest_offset(rows: int, *tensors: torch.Tensor) -> int:
    """The largest element offset the kernel forms into any of ``tensors`` for ``rows`` batch rows."""
    return max(
        (rows - 1) * x.stride(0)
        + sum((size - 1) * stride for size, stride in zip(x.shape[1:], x.stride()[1:], strict=True))
        for x in tensors
    )


def batch_slices(batch: int, tensors: tuple[torch.Tensor, ...], limit: int = OFFSET_LIMIT) -> list[slice]:
    """Slices of the batch whose offsets stay within ``limit`` (one slice: all rows, when they fit)."""
    if largest_offset(1, *tensors) > limit:
        raise ValueError(f"one batch row's offsets pass {limit}: the window is too long for the kernel")
    rows = batch
    while rows > 1 and largest_offset(rows, *tensors) > limit:
        rows //= 2
    return [slice(first, min(first + rows, batch)) for first in range(0, batch, rows)]


def relative_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    distances: torch.Tensor,
    *,
    block: int = 64,
    offset_limit: int = OFFSET_LIMIT,
) -> torch.Tensor:
    """softmax(q . k + distances[i, T - i + j]) @ v per head.

    q, k: [B, T, N, E] (E = the fused layer's extended width), v: [B, T, N, Dh], distances: [B, N, T, 2T]
    (any strides with a unit last one); returns [B, T, N, Dh] in q's dtype. fp32 products are IEEE
    (no TF32), so fp32 stays within rounding of the torch formulation. A batch whose offsets would pass
    ``offset_limit`` runs in slices (`batch_slices`).
    """
    b, t, n, width = q.shape
    dh = v.shape[-1]
    if k.shape != q.shape or v.shape[:3] != (b, t, n) or distances.shape != (b, n, t, 2 * t):
        raise ValueError(
            f"shapes q {q.shape}, k {k.shape}, v {v.shape}, distances {distances.shape} disagree"
        )
    if dh & (dh - 1) or dh < 16:
        raise ValueError(f"the value width {dh} must be a power of two >= 16")
    if any(x.stride(-1) != 1 for x in (q, k, v, distances)):
        raise ValueError("the last dimension of q, k, v and distances must be contiguous")
    out = torch.empty(b, t, n, dh, dtype=q.dtype, device=q.device)
    for rows in batch_slices(b, (q, k, v, distances, out), offset_limit):
        _launch(q[rows], k[rows], v[rows], distances[rows], out[rows], block)
    return out


def _launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distances: torch.Tensor, out: torch.Tensor, block: int
) -> None:
    """One kernel launch over all of ``q``'s batch rows (offsets already known to fit)."""
    b, t, n, width = q.shape
    e1, e2 = _split_width(width)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (-(-t // block), b * n)
    _kernel()[grid](
        q, k, v, distances, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), distances.stride(0), distances.stride(1), distances.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        n, t, width,
        BLOCK_M=block, BLOCK_N=block, E1=e1, E2=e2, DV=v.shape[-1], PRECISION=precision,
    )  # fmt: skip


@torch.library.custom_op("xlnetqa::relative_attention", mutates_args=())
def relative_attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distances: torch.Tensor
) -> torch.Tensor:
    """`relative_attention` as one operator: a compiled model calls the kernel instead of breaking its
    graph around it (operands a compiler laid out otherwise are made row-contiguous first)."""
    q, k, v, distances = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, distances))
    return relative_attention(q, k, v, distances)


@relative_attention_op.register_fake
def _relative_attention_shape(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distances: torch.Tensor
) -> torch.Tensor:
    b, t, n, _ = q.shape
    return q.new_empty(b, t, n, v.shape[-1])
