"""The fused layer's attention as onnxruntime's ``com.microsoft::MultiHeadAttention``, for the CPU graph.

onnxruntime's contrib attention runs scores, softmax and the value product as one kernel, and takes an
additive ``attention_bias`` [B, N, T, T]: XLNet's position term goes there. Everything else of
`train.model.fused` stays as it is: the query and key are `fused_head_width` wide, so the content
scores, the segment term and the padding mask remain one product inside the operator (its ``scale`` is
1: the query mask applies 1/sqrt(d_head)). Its CPU kernel accepts a query/key head width (72) other than
the value's (64).

The exported layer is then: the projection, one Split, the query mask's Mul, the key's Add, the operator,
and the position term. Its query chunks (`CHUNKS`, as the plain graph's: rows [a, e) need only T + e - a
of the 2T distances, 62.5% of the full product's work with 4 chunks) are one batch dimension of one
product here, not a product per chunk (six nodes a chunk): each chunk's window of the layer's position
table is one Gather of rows by an index built once per forward (`chunk_rows`), and the relative shift of
every chunk is the same slices of the product read flat (`train.model.fused.PositionChunk`). Chunks of
equal rows need a length that is a multiple of their count: the model pads its inputs up to one with
masked padding tokens (`pad_inputs`) and cuts its output back, once per forward. 23 nodes a layer as
onnxruntime runs the int8 graph, against 54 for the plain one.

Used only while exporting the CPU graph (`exporting`): eager and the graph runners keep the plain
formulation, and the autograd Function's own forward computes the same math for the trace. The
standard-ops ("portable") graph that TensorRT and the GPU providers load is exported without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from qa_core.contract import SEG_ID_PAD
from train.model.fused import POSITION_CHUNKS, FusedInputs

DOMAIN = "com.microsoft"
OP_TYPE = "MultiHeadAttention"
OPERATOR = f"{DOMAIN}::{OP_TYPE}"
OPSET = 1  # the contrib domain's version in the exported graph's opset_import

CHUNKS = POSITION_CHUNKS  # query chunks of the position term, a batch dimension of one product here
_EXPORTING = False


@contextlib.contextmanager
def exporting(enabled: bool = True) -> Iterator[None]:
    """Within it, a traced fused forward emits the contrib operator (the exporter's CPU graph)."""
    global _EXPORTING
    before = _EXPORTING
    _EXPORTING = enabled
    try:
        yield
    finally:
        _EXPORTING = before


def wanted() -> bool:
    """Only inside `exporting` and only while tracing: an eager forward keeps the faster chunked math."""
    return _EXPORTING and torch.jit.is_tracing()


def padded_length(length: int) -> int:
    """The window length the graph computes at: a multiple of `CHUNKS`, so every chunk has the same rows."""
    return (length + CHUNKS - 1) // CHUNKS * CHUNKS


def pad_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs padded with masked padding tokens up to `padded_length` (once per forward: the real
    tokens' outputs do not change, and the model cuts its output back to the real length)."""
    batch, length = input_ids.shape
    extra = padded_length(length) - length
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)

    def pad(x: torch.Tensor, value: int) -> torch.Tensor:
        return nn.functional.pad(x, (0, extra), value=value)

    return pad(input_ids, 0), pad(attention_mask, 0), pad(token_type_ids, SEG_ID_PAD)


class ContribInputs(NamedTuple):
    """What every layer's contrib attention reads, built once per forward (`contrib_inputs`)."""

    query_mask: torch.Tensor  # [B, T, N E]: `FusedInputs.query_mask` for every head, flat as the op reads it
    key_add: torch.Tensor  # [B, T, N E]
    rows: torch.Tensor  # [C, T + T/C]: the position table rows (distances) each query chunk reads
    columns: int  # Dh + 1: the query columns the position term reads (a number: read from a table, it
    # would be a shape node per layer)


def chunk_rows(inputs: FusedInputs) -> torch.Tensor:
    """The table rows of each query chunk: chunk c (queries [c r, c r + r), r = T / C) reads T + r
    distances from row L - (c + 1) r of a layer's table (`PositionChunk`). The windows overlap, so each
    layer gathers its own (one Gather of whole rows of Dh + 1 numbers; gathered for all layers at once,
    the Split into layers would copy them all again)."""
    t = inputs.length
    rows = t // CHUNKS
    half = inputs.table_start + t
    chunk = torch.arange(CHUNKS, device=inputs.query_mask.device)
    return (half - (chunk[:, None] + 1) * rows) + torch.arange(t + rows, device=inputs.query_mask.device)


def contrib_inputs(inputs: FusedInputs, n_head: int, columns: int) -> ContribInputs:
    """The flat masks and the chunks' table rows (see `ContribInputs`); `inputs` of the padded length."""
    b, t, width = inputs.batch, inputs.length, inputs.query_mask.shape[-1]

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.expand(b, t, n_head, width).reshape(b, t, n_head * width)

    return ContribInputs(flat(inputs.query_mask), flat(inputs.key_add), chunk_rows(inputs), columns)


def shifted_positions(
    q: torch.Tensor, window: torch.Tensor, batch: int, n_head: int, length: int
) -> torch.Tensor:
    """[B, N, T, T] position scores from the head's query columns in chunks ([B, N, C, T/C, Dh + 1]) and
    the chunks' windows: one batched product [B, N, C, r, T + r], then the relative shift of every chunk
    at once, as slices of the product read flat (`PositionChunk`: all chunks have the same shape). The
    sizes are passed, not read from the tensors: read, each would be a shape node per layer."""
    b, n, rows = batch, n_head, length // CHUNKS
    width = length + rows
    product = q @ window.transpose(-1, -2)
    flat = product.reshape(b, n, CHUNKS, -1)[..., rows : rows + rows * (width - 1)]
    return flat.reshape(b, n, CHUNKS, rows, width - 1)[..., :length].reshape(b, n, length, length)


class MultiHeadAttention(torch.autograd.Function):
    """softmax(q . k + bias) @ v per head (no scale); exported as ``com.microsoft::MultiHeadAttention``."""

    @staticmethod
    def forward(
        ctx: object,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        bias: torch.Tensor,
        n_head: int,
    ) -> torch.Tensor:
        b, t = query.shape[:2]
        q = query.reshape(b, t, n_head, -1).transpose(1, 2)
        k = key.reshape(b, t, n_head, -1).permute(0, 2, 3, 1)
        v = value.reshape(b, t, n_head, -1).transpose(1, 2)
        probs = torch.softmax(q @ k + bias, dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, t, value.shape[-1])

    @staticmethod
    def symbolic(
        g: Any,  # torch.onnx's GraphContext (a private class)
        query: torch.Value,
        key: torch.Value,
        value: torch.Value,
        bias: torch.Value,
        n_head: int,
    ) -> torch.Value:
        none = g.op("prim::Constant").setType(torch._C.OptionalType.ofTensor())  # an omitted input
        out = g.op(OPERATOR, query, key, value, none, none, bias, num_heads_i=n_head, scale_f=1.0)
        return out.setType(value.type())


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    table: torch.Tensor,
    shared: ContribInputs,
    inputs: FusedInputs,
    n_head: int,
) -> torch.Tensor:
    """One layer's attended values [B, T, N Dh] from its projection's q, k ([B, T, N E]) and v."""
    b, t = inputs.batch, inputs.length
    q = q * shared.query_mask
    k = k + shared.key_add
    heads = q.reshape(b, CHUNKS, t // CHUNKS, n_head, -1).permute(0, 3, 1, 2, 4)[..., : shared.columns]
    window = table[:, :, shared.rows]  # [1, N, C, T + r, Dh + 1]
    bias = shifted_positions(heads, window, b, n_head, t)
    return MultiHeadAttention.apply(q, k, v, bias, n_head)
