"""XLNet's content-stream attention for inference in few operations: what eager, ONNX and the graph runners run.

The reference layer (`RelativeAttention.forward`) spends most of its operations on plumbing: three
projections, three bias adds and a scale, a segment term built with Where over [B, N, T, T], and the
relative shift of Transformer-XL; traced for ONNX, each reshape also computes its shape from the tensor
it reshapes (4 layers: 722 nodes, 152 of them Unsqueeze). Here, per layer:

- one projection ``h @ W_in + b_in`` gives every head's query, key and value. Weight-only arithmetic is
  done once, when the weights are prepared: the content bias ``r_w_bias`` is folded into the query
  columns, and the segment term becomes columns of its own (below). The 1/sqrt(d_head) scale is applied
  by the per-token query mask (a Mul that is there anyway), not folded into the weights: the int8 export
  quantizes this projection with one scale per tensor, and query weights 8x smaller than the key and
  value weights beside them lost resolution (int8 agreed with fp32 on 96% of answered questions instead
  of 99%).
- the query and key of a head are ``E`` wide (`fused_head_width`: d_head + 1 + 4 segment ids, padded to
  a multiple of 8: 64 -> 72): the head's columns, a bias column (1 in the query, the key's padding bias:
  0 or very negative), then the segment term. where(same segment, a_i, b_i) is b_i + (a_i - b_i) *
  same(i, j); b_i is constant along the softmax row and dropped, and same(i, j) = onehot(type_i) .
  onehot(type_j), so the query carries (a_i - b_i) times its one-hot (4 columns computed by the
  projection, masked per token) and the key its one-hot. Content scores, segment term and padding mask
  are one MatMul.
- the position scores: the query's first d_head + 1 columns against a precomputed table of projected
  relative positions whose extra column is the position bias ``(r_r_bias - r_w_bias) . k_r`` (met by
  the query's 1), then the relative shift as index arithmetic: row i reads distance column T - i + j,
  which in the product read flat is one contiguous slice viewed with a row stride one less than the
  product's (`PositionChunk`). Per query chunk, so that rows do not pay for distances they never read.
  (A GatherElements by a precomputed index is one node, but on the CPU it took 1.5 ms per xlnet-base
  layer at 1x384 against 0.8 for the slices: it reads an int64 index per score.)
- softmax(content + position) @ v, one output projection, residual, LayerNorm.

Shapes are read once per forward (`FusedInputs`), so every layer's reshapes share the same shape values
(onnxruntime merges their identical shape nodes). Numbers are those of the reference up to float
rounding at every real token; padding rows attend to the real tokens only (the reference also lets them
see themselves), and no real token reads a padding row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import nn

from qa_core.contract import GRAPH_MIN_TOKENS, NUM_SEGMENT_IDS, fused_head_width
from train.model import triton_attention

if TYPE_CHECKING:
    from train.model.attention import RelativeAttention

# Query chunks of the position term: rows [a, e) need T + (e - a) of the 2T distances, so 4 chunks
# compute 62.5% of the full [T, 2T] product. On a 2-core CPU (int8 xlnet-base, 1x384) 4 chunks ran as
# fast as the reference graph and 1 chunk ~10% slower: the product's FLOPs cost more than its nodes.
# Traced, every chunk must hold a row, so the exported graph's shortest window is this many tokens.
POSITION_CHUNKS = GRAPH_MIN_TOKENS


class PositionChunk(NamedTuple):
    """Query rows [first, end) of the position term and where their numbers live (all shape arithmetic).

    Row i reads the distances i - j, the table's columns L - i + j; rows [first, end) together need the
    columns [L - end + 1, L - first + T), taken as [table_from, table_to): T + (end - first) of them. In
    the product [rows, width] of those rows with those columns, row r's keys start at column
    (end - first) - r: read flat, that is offset (end - first) + r * (width - 1), so one contiguous slice
    [flat_from, flat_to) viewed as [rows, width - 1] holds every row's keys in its first T columns.
    """

    first: int
    end: int
    table_from: int
    table_to: int
    flat_from: int
    flat_to: int
    row_width: int  # width - 1


def position_chunks(length: int, table_len: int, chunks: int) -> tuple[PositionChunk, ...]:
    """`chunks` near-equal query chunks (one for a short eager input: chunking would only add work)."""
    if not torch.jit.is_tracing() and length < 2 * chunks:
        chunks = 1
    half = table_len // 2
    out = []
    for c in range(chunks):
        first, end = (c * length) // chunks, ((c + 1) * length) // chunks
        rows = end - first
        width = length + rows
        out.append(
            PositionChunk(
                first, end, half - end, half - end + width, rows, rows + rows * (width - 1), width - 1
            )
        )
    return tuple(out)


class FusedInputs(NamedTuple):
    """What every layer reads, built once per forward from the inputs' shape, segments and padding."""

    batch: int
    length: int
    query_mask: torch.Tensor  # [B, T, 1, E]: the scale on the head's columns, 1 on the bias column, the
    # token's segment one-hot (times the scale and the segment gain), 0s
    key_add: torch.Tensor  # [B, T, 1, E]: 0 on the head's columns, the padding bias, the one-hot, 0s
    chunks: tuple[PositionChunk, ...]  # the query rows of the position term, in order
    table_start: int  # the window's distances T .. -T+1 start at this column of each layer's table


def fused_inputs(
    token_type_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    *,
    batch: int,
    length: int,
    d_head: int,
    scale: float,
    segment_gain: float,
    table_len: int,
    mask_value: float,
    dtype: torch.dtype,
    device: torch.device,
) -> FusedInputs:
    """The per-forward tensors of `fused_attention` (see the module docstring for each column)."""
    width = fused_head_width(d_head)
    if token_type_ids is not None:  # ids are 0..NUM_SEGMENT_IDS-1 (paragraph, question, <cls>, padding)
        ids = torch.arange(NUM_SEGMENT_IDS, device=device)
        onehot = (token_type_ids[:, :, None] == ids).to(dtype)
    else:
        onehot = torch.zeros(batch, length, NUM_SEGMENT_IDS, dtype=dtype, device=device)
    if attention_mask is not None:
        pad = (attention_mask == 0)[:, :, None]
        key_bias = torch.zeros(pad.shape, dtype=dtype, device=device).masked_fill(pad, mask_value)
    else:
        key_bias = torch.zeros(batch, length, 1, dtype=dtype, device=device)
    rest = width - d_head - 1 - NUM_SEGMENT_IDS
    query_mask = torch.cat(
        [
            torch.full((batch, length, d_head), scale, dtype=dtype, device=device),
            torch.ones(batch, length, 1, dtype=dtype, device=device),  # meets the padding / position bias
            onehot * (scale * segment_gain),
            torch.zeros(batch, length, rest, dtype=dtype, device=device),
        ],
        -1,
    )
    zeros = torch.zeros(batch, length, d_head, dtype=dtype, device=device)
    key_add = torch.cat([zeros, key_bias, onehot, zeros[..., :rest]], -1)
    return FusedInputs(
        batch=batch,
        length=length,
        query_mask=query_mask[:, :, None],
        key_add=key_add[:, :, None],
        chunks=position_chunks(length, table_len, POSITION_CHUNKS),
        table_start=table_len // 2 - length,
    )


@torch.no_grad()
def segment_columns(attn: RelativeAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """The segment term's query columns (weight [D, N], bias [N]): a_i - b_i = (q_i + r_s_bias) . delta
    per head, delta = seg_embed[0] - seg_embed[1] (same segment minus different), before the scale."""
    f32 = torch.float32
    delta = (attn.seg_embed[0] - attn.seg_embed[1]).detach().to(f32)  # [N, Dh]
    weight = torch.einsum("dnh,nh->dn", attn.q.detach().to(f32), delta)
    return weight, (attn.r_s_bias.detach().to(f32) * delta).sum(-1)


def segment_gain(layers: Sequence[RelativeAttention]) -> float:
    """How much larger the segment columns' weights are than the q, k, v weights beside them (at least 1):
    the fused projection divides them by it and the query mask multiplies it back. int8 quantizes the
    projection with one scale per tensor, so columns several times larger than the rest (3-6x in the
    reader-v3 model) would set that scale and cost q, k and v two bits of resolution."""
    ratios = [
        float(segment_columns(a)[0].abs().max())
        / float(torch.stack([getattr(a, n).detach().abs().max() for n in ("q", "k", "v")]).max())
        for a in layers
    ]
    return max([1.0, *ratios])


class FusedAttentionWeights(nn.Module):
    """One layer's weights rearranged for `fused_attention`, computed once (buffers, not parameters).

    Built from the layer's parameters and its projected relative positions ``k_r`` ([1, N, 2L, Dh],
    distances L .. -L+1): the weights are copies, so rebuild after changing the model's weights.
    """

    w_in: torch.Tensor  # [2 N E + N Dh, D] (a Linear's layout)
    b_in: torch.Tensor  # [2 N E + N Dh]
    kr: torch.Tensor  # [1, N, 2L, Dh + 1]: the projected positions and the position bias
    w_out: torch.Tensor  # [D, N Dh]

    @torch.no_grad()
    def __init__(self, attn: RelativeAttention, k_r: torch.Tensor, segment_gain: float = 1.0) -> None:
        super().__init__()
        n, dh, d = attn.n_head, attn.d_head, attn.d_model
        width = fused_head_width(dh)
        one = dh  # the bias column: 1 in the query, the padding bias in the key, the position bias in kr
        seg0, seg_end = dh + 1, dh + 1 + NUM_SEGMENT_IDS
        f32 = torch.float32
        wq, wk, wv, wo = (getattr(attn, name).detach().to(f32) for name in ("q", "k", "v", "o"))  # [D, N, Dh]
        r_w, r_r, r_s = (
            getattr(attn, name).detach().to(f32) for name in ("r_w_bias", "r_r_bias", "r_s_bias")
        )
        scale = attn.scale
        dev = attn.q.device  # built where the model is: the torch backend moves it to the GPU first
        q_w = torch.zeros(d, n, width, device=dev)
        q_b = torch.zeros(n, width, device=dev)
        q_w[:, :, :dh] = wq  # the scale comes with the query mask (`fused_inputs`)
        q_b[:, :dh] = r_w
        seg_w, seg_b = (x / segment_gain for x in segment_columns(attn))  # the mask multiplies it back
        q_w[:, :, seg0:seg_end] = seg_w[:, :, None]
        q_b[:, seg0:seg_end] = seg_b[:, None]
        q_b[:, one] = 1.0
        k_w = torch.zeros(d, n, width, device=dev)
        k_w[:, :, :dh] = wk
        w_in = torch.cat([q_w.reshape(d, -1), k_w.reshape(d, -1), wv.reshape(d, -1)], dim=1)
        b_in = torch.cat([q_b.reshape(-1), torch.zeros(n * width + n * dh, device=dev)])
        k_r32 = k_r.detach().to(f32)  # [1, N, 2L, Dh]
        position_bias = torch.einsum("bnph,nh->bnp", k_r32, (r_r - r_w) * scale)
        kr = torch.cat([k_r32, position_bias[..., None]], -1)
        dtype = attn.q.dtype
        self.register_buffer("w_in", w_in.t().contiguous().to(dtype), persistent=False)
        self.register_buffer("b_in", b_in.to(dtype), persistent=False)
        self.register_buffer("kr", kr.contiguous().to(dtype), persistent=False)
        self.register_buffer("w_out", wo.reshape(d, -1).clone().to(dtype), persistent=False)
        self.n_head, self.d_head, self.width = n, dh, width


def position_scores(q: torch.Tensor, kr: torch.Tensor, inputs: FusedInputs, n_head: int) -> torch.Tensor:
    """[B, N, T, T] position scores: per query chunk, one MatMul against its columns of the table and
    the relative shift as two slices of the product read flat (see `PositionChunk`). The head count is
    passed, not read from q: read, it would be a shape node per layer in the exported graph."""
    b, n, t = inputs.batch, n_head, inputs.length
    q = q[..., : kr.shape[-1]]  # the head's columns and the bias column
    parts = []
    for c in inputs.chunks:
        rows = q if len(inputs.chunks) == 1 else q[:, :, c.first : c.end]
        product = rows @ kr[:, :, c.table_from : c.table_to].transpose(-1, -2)  # [B, N, rows, width]
        flat = product.reshape(b, n, -1)[:, :, c.flat_from : c.flat_to]
        parts.append(flat.reshape(b, n, c.end - c.first, c.row_width)[..., :t])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


# What attends instead of the formulation below: (q, k, v) as the projection gives them ([B, T, N E] and
# [B, T, N Dh]) -> the attended values [B, T, N Dh] (`train.model.contrib_attention` for the CPU graph).
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def fused_attention(
    attn: RelativeAttention, h: torch.Tensor, inputs: FusedInputs, attend: Attend | None = None
) -> torch.Tensor:
    """One layer's content-stream attention, residual and LayerNorm (see the module docstring)."""
    w = cast(FusedAttentionWeights, attn.fused)  # set by XLNetModel.cache_positions(fused=True)
    b, t, n, dh, width = inputs.batch, inputs.length, w.n_head, w.d_head, w.width
    proj = nn.functional.linear(h, w.w_in, w.b_in)
    q, k, v = proj.split([n * width, n * width, n * dh], dim=-1)
    if attend is not None:
        return _output(attn, h, w, attend(q, k, v))
    q = q.reshape(b, t, n, width) * inputs.query_mask  # [B, T, N, E]
    k = k.reshape(b, t, n, width) + inputs.key_add
    v = v.reshape(b, t, n, dh)
    if triton_attention.wanted(h, dh):  # one kernel from here to the attended values (on a GPU)
        start = inputs.table_start
        window = w.kr[:, :, start : start + 2 * t].transpose(-1, -2)
        distances = q[..., : w.kr.shape[-1]].transpose(1, 2) @ window  # [B, N, T, 2T]
        attended = torch.ops.xlnetqa.relative_attention(q, k, v, distances).reshape(b, t, n * dh)
    else:
        q = q.transpose(1, 2)  # [B, N, T, E]
        scores = q @ k.permute(0, 2, 3, 1) + position_scores(q, w.kr, inputs, n)
        probs = torch.softmax(scores, dim=-1)
        attended = (probs @ v.transpose(1, 2)).transpose(1, 2).reshape(b, t, n * dh)
    return _output(attn, h, w, attended)


def _output(
    attn: RelativeAttention, h: torch.Tensor, w: FusedAttentionWeights, attended: torch.Tensor
) -> torch.Tensor:
    """The output projection, attention-on-attention where the model has it, residual and LayerNorm."""
    out = nn.functional.linear(attended, w.w_out)
    if attn.aoa is not None:
        out = attn.aoa(h, out)
    return attn.layer_norm(out + h)
