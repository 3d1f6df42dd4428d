"""Attention with a sliding window and/or soft-capped scores (Mistral, Gemma 2/3), in plain torch.

Each sequence's keys are gathered from the paged cache (its new K/V are stored there first), from the first
one its earliest new query can see, and masked causally and to the window: query at position p sees keys
p - window < j <= p (transformers' sliding_window_overlay). Scores are float32, capped as
softcap * tanh(score / softcap) before the softmax, which is why no fused SDPA call serves here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import AttentionMetadata


@dataclass
class MaskedPlan:
    rows: torch.Tensor  # int64 [batch, max_q]: the flat query row of each (sequence, query), padding -> 0
    valid: torch.Tensor  # bool [batch, max_q]
    slots: torch.Tensor  # int64 [batch, max_keys]: cache slots of the keys each sequence may see
    bias: torch.Tensor  # float32 [batch, 1, max_q, max_keys]: 0 where a query may attend, -inf elsewhere


def make_masked_plan(meta: AttentionMetadata, block_size: int, window: int | None) -> MaskedPlan:
    device = meta.block_tables.device
    cu = meta.cu_seqlens_q.long()
    q_lens, lens = cu[1:] - cu[:-1], meta.seq_lens.long()
    first_q = lens - q_lens  # position of each sequence's first new token
    start = (first_q - window + 1).clamp_(min=0) if window is not None else torch.zeros_like(first_q)
    max_q, max_keys = int(q_lens.max()), int((lens - start).max())
    qpos = torch.arange(max_q, device=device)
    valid = qpos[None, :] < q_lens[:, None]
    rows = torch.where(valid, cu[:-1, None] + qpos[None, :], 0)
    kpos = start[:, None] + torch.arange(max_keys, device=device)[None, :]  # absolute key positions
    tables = meta.block_tables.long()
    block_index = (kpos // block_size).clamp_(max=tables.shape[1] - 1)  # past a sequence's end: padding
    slots = torch.gather(tables, 1, block_index) * block_size + kpos % block_size
    query_at = first_q[:, None] + qpos[None, :]
    allowed = kpos[:, None, :] <= query_at[:, :, None]
    if window is not None:
        allowed &= kpos[:, None, :] > query_at[:, :, None] - window
    allowed[:, :, 0] |= ~valid  # padding rows see one key, so their softmax stays finite
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, float("-inf"))
    return MaskedPlan(rows, valid, slots, bias[:, None])


def masked_attention(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, plan: MaskedPlan, scale: float,
                     softcap: float | None) -> torch.Tensor:
    """q [n, hq, d]; k_flat/v_flat [slots, hkv, d] (the cache, new K/V already stored) -> [n, hq, d]."""
    batch, max_q = plan.rows.shape
    hq, d = q.shape[1], q.shape[2]
    hkv = k_flat.shape[1]
    group = hq // hkv
    # Fold each KV head's query-head group into the query length: K/V are never expanded to hq heads.
    queries = q[plan.rows].permute(0, 2, 1, 3).reshape(batch, hkv, group * max_q, d).float()
    keys, values = _gather(k_flat, plan.slots), _gather(v_flat, plan.slots)
    scores = torch.matmul(queries, keys.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, hkv, group, max_q, -1) + plan.bias[:, :, None]
    out = torch.matmul(torch.softmax(scores, dim=-1).view(batch, hkv, group * max_q, -1), values)
    out = out.view(batch, hq, max_q, d).transpose(1, 2)[plan.valid]
    result = torch.empty_like(q)
    result[plan.rows[plan.valid]] = out.to(q.dtype)
    return result


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[slots, hkv, d] rows at slots [batch, keys] -> float32 [batch, hkv, keys, d], by index_select over whole
    rows (aten::index copies element by element: several times slower, torch_backend._gather_rows)."""
    rows = cache.reshape(cache.shape[0], -1).index_select(0, slots.reshape(-1))
    return rows.view(*slots.shape, *cache.shape[1:]).transpose(1, 2).float()
