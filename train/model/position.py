"""Relative positional encodings and attention masks, built from shapes with arange/comparisons.

Nothing here uses `torch.eye`, one-hot or data-dependent Python branching on tensor values, so the
graph traced for ONNX/TensorRT keeps dynamic batch and sequence axes (EyeLike/OneHot break TensorRT).
"""

from __future__ import annotations

import torch


def sinusoid_table(pos_seq: torch.Tensor, d_model: int) -> torch.Tensor:
    """[R] float positions -> [R, d_model] (sin half, cos half), as in Transformer-XL."""
    freq_seq = torch.arange(0, d_model, 2, dtype=torch.int64, device=pos_seq.device).float()
    inv_freq = 1 / torch.pow(10000, freq_seq / d_model)
    angles = pos_seq[:, None] * inv_freq[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def relative_positions(
    qlen: int,
    klen: int,
    d_model: int,
    *,
    attn_type: str,
    bi_data: bool,
    clamp_len: int,
    batch_size: int,
    device: torch.device,
) -> torch.Tensor:
    """Position encodings of the distances klen .. -qlen+1 (bi) or klen .. 0 (uni).

    Returns [1, R, D], or [B, R, D] with `bi_data` (forward distances for the first half of the batch,
    backward distances for the second half, as the original bidirectional pipeline).
    """
    beg = klen
    end = -qlen if attn_type == "bi" else -1
    fwd = torch.arange(beg, end, -1, dtype=torch.int64, device=device).float()
    if clamp_len > 0:
        fwd = fwd.clamp(-clamp_len, clamp_len)
    fwd_emb = sinusoid_table(fwd, d_model)[None]
    if not bi_data:
        return fwd_emb
    if batch_size % 2 != 0:
        raise ValueError(f"bi_data needs an even batch size (half forward, half backward), got {batch_size}")
    bwd = torch.arange(-beg, -end, 1, dtype=torch.int64, device=device).float()
    if clamp_len > 0:
        bwd = bwd.clamp(-clamp_len, clamp_len)
    bwd_emb = sinusoid_table(bwd, d_model)[None]
    half = batch_size // 2
    return torch.cat([fwd_emb.expand(half, -1, -1), bwd_emb.expand(half, -1, -1)], dim=0)


def relative_shift(scores: torch.Tensor, klen: int) -> torch.Tensor:
    """[B, N, T, R] scores against distances -> [B, N, T, klen] scores against key positions.

    The reshape trick of Transformer-XL: pure reshapes and slices, no gather.
    """
    b, n, t, r = scores.shape
    shifted = scores.reshape(b, n, r, t)[:, :, 1:, :].reshape(b, n, t, r - 1)
    return shifted[..., :klen]


def attention_masks(
    qlen: int,
    mlen: int,
    *,
    attention_mask: torch.Tensor | None,
    perm_mask: torch.Tensor | None,
    attn_type: str,
    same_length: bool,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Boolean masks (True = may NOT attend) for the content and query streams, [B|1, T, M+T].

    Memory is always visible. The query stream obeys the data (padding + permutation) mask; the
    content stream additionally always sees its own position (the "non-target" mask of XLNet).
    """
    klen = mlen + qlen
    rows = torch.arange(qlen, device=device)[:, None]
    cols = torch.arange(klen, device=device)[None, :]
    masked: torch.Tensor | None = None
    if attn_type == "uni":
        masked = cols > rows + mlen
        if same_length:
            masked = masked | (cols < rows)
        masked = masked[None]
    data: torch.Tensor | None = None
    if attention_mask is not None:
        data = (attention_mask == 0)[:, None, :]
    if perm_mask is not None:
        perm = perm_mask > 0
        data = perm if data is None else (data | perm)
    if data is not None:
        if mlen > 0:
            mem_visible = torch.zeros(data.shape[0], data.shape[1], mlen, dtype=torch.bool, device=device)
            data = torch.cat([mem_visible, data], dim=-1)
        masked = data if masked is None else (masked | data)
    if masked is None:
        return None, None
    is_self = cols == rows + mlen
    content = masked & ~is_self[None]
    return content, masked


def segment_difference(token_type_ids: torch.Tensor | None, mlen: int) -> torch.Tensor | None:
    """[B, T, M+T] True where query and key are in different segments (memory counts as segment 0)."""
    if token_type_ids is None:
        return None
    if mlen > 0:
        mem_segments = torch.zeros(
            token_type_ids.shape[0], mlen, dtype=token_type_ids.dtype, device=token_type_ids.device
        )
        key_segments = torch.cat([mem_segments, token_type_ids], dim=1)
    else:
        key_segments = token_type_ids
    return token_type_ids[:, :, None] != key_segments[:, None, :]
