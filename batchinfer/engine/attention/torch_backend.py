"""Attention in plain torch over the paged KV cache: batched decode and per-sequence extend.

Each step's metadata is planned once (gather indices, masks) and reused by every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionMetadata


@dataclass
class _Plan:
    num_decode: int  # the batch starts with this many one-token sequences
    decode_slots: torch.Tensor | None  # int64 [num_decode, max_len] cache slots to gather
    decode_mask: torch.Tensor | None  # bool [num_decode, 1, 1, max_len]
    extends: list[tuple[int, int, torch.Tensor | None, torch.Tensor | None]]  # (q_start, q_end, slots, mask)


class TorchAttentionBackend(AttentionBackend):
    def __init__(self):
        self._plan_for: AttentionMetadata | None = None
        self._plan: _Plan | None = None

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        k_flat = k_cache.view(-1, *k_cache.shape[2:])
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        k_flat[meta.slot_mapping] = k
        v_flat[meta.slot_mapping] = v
        plan = self._get_plan(meta, k_cache.shape[1])
        out = torch.empty_like(q)
        if plan.num_decode:
            out[:plan.num_decode] = self._decode(q[:plan.num_decode], k_flat, v_flat, plan, scale)
        for start, end, slots, mask in plan.extends:
            if slots is None:  # nothing cached before this chunk: attend to the new tokens directly
                out[start:end] = _sdpa(q[start:end], k[start:end], v[start:end], None, scale, causal=True)
            else:
                out[start:end] = _sdpa(q[start:end], k_flat[slots], v_flat[slots], mask, scale, causal=False)
        return out

    def _decode(self, q, k_flat, v_flat, plan: _Plan, scale: float) -> torch.Tensor:
        keys = k_flat[plan.decode_slots].transpose(1, 2)  # [batch, kv_heads, max_len, head_dim]
        values = v_flat[plan.decode_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=plan.decode_mask,
                                             scale=scale, enable_gqa=True)
        return out.squeeze(2)

    def _get_plan(self, meta: AttentionMetadata, block_size: int) -> _Plan:
        if self._plan_for is not meta:
            self._plan = _make_plan(meta, block_size)
            self._plan_for = meta
        return self._plan


def _sdpa(q, k, v, mask, scale: float, causal: bool) -> torch.Tensor:
    """q [n, hq, d], k/v [m, hkv, d] -> [n, hq, d]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def _slots(block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(length, device=block_table.device)
    return block_table[pos // block_size].long() * block_size + pos % block_size


def _make_plan(meta: AttentionMetadata, block_size: int) -> _Plan:
    cu = meta.cu_seqlens_q.tolist()
    seq_lens = meta.seq_lens.tolist()
    q_lens = [b - a for a, b in zip(cu, cu[1:])]
    num_decode = 0
    while num_decode < len(q_lens) and q_lens[num_decode] == 1:
        num_decode += 1
    decode_slots = decode_mask = None
    if num_decode:
        lens = meta.seq_lens[:num_decode].long()
        max_len = max(seq_lens[:num_decode])
        pos = torch.arange(max_len, device=lens.device)
        tables = meta.block_tables[:num_decode].long()
        decode_slots = torch.gather(tables, 1, (pos // block_size).expand(num_decode, -1)) * block_size + pos % block_size
        decode_mask = (pos[None, :] < lens[:, None])[:, None, None, :]
    extends = []
    for i in range(num_decode, len(q_lens)):
        start, end, total = cu[i], cu[i + 1], seq_lens[i]
        if total == q_lens[i]:
            extends.append((start, end, None, None))
            continue
        cached = total - q_lens[i]
        mask = torch.arange(total)[None, :] <= (cached + torch.arange(q_lens[i]))[:, None]
        extends.append((start, end, _slots(meta.block_tables[i], total, block_size), mask.to(meta.seq_lens.device)))
    return _Plan(num_decode, decode_slots, decode_mask, extends)
