"""Attention in plain torch over the paged KV cache.

Each step is planned once (gather indices, masks) and the plan serves every layer. Sequences with
nothing cached attend to their own new K/V with a causal mask; all others (decodes, extends over a
cached prefix) are padded into one batch whose K/V is gathered from the cache in one indexing op.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionMetadata

# Extends longer than this run on their own rather than padding every row of the batch to their length.
MAX_BATCHED_QUERY_LEN = 64


@dataclass
class _PaddedBatch:
    rows: torch.Tensor  # int64 [batch, max_q]: the flat query row of each (sequence, query), padding -> 0
    valid: torch.Tensor  # bool [batch, max_q]
    out_rows: torch.Tensor  # int64 [num_valid]: rows[valid]
    slots: torch.Tensor  # int64 [batch, max_len]: cache slots of each sequence's keys, padding -> slot 0
    bias: torch.Tensor  # float [batch, 1, max_q, max_len]: 0 where a query may attend, -inf elsewhere


@dataclass
class _Plan:
    fresh: list[tuple[int, int]]  # query ranges with no cached prefix: causal attention over their own K/V
    batches: list[_PaddedBatch]


class TorchAttentionBackend(AttentionBackend):
    def __init__(self):
        self._plan_for: AttentionMetadata | None = None
        self._plan: _Plan | None = None

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        k_flat = k_cache.view(-1, *k_cache.shape[2:])
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        k_flat.index_copy_(0, meta.slot_mapping, k)
        v_flat.index_copy_(0, meta.slot_mapping, v)
        plan = self._get_plan(meta, k_cache.shape[1], q.dtype)
        out = torch.empty_like(q)
        for start, end in plan.fresh:
            out[start:end] = _causal_sdpa(q[start:end], k[start:end], v[start:end], scale)
        for batch in plan.batches:
            out[batch.out_rows] = _padded_attention(q, k_flat, v_flat, batch, scale)
        return out

    def _get_plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> _Plan:
        if self._plan is None or self._plan_for is not meta:
            self._plan = make_plan(meta, block_size, dtype)
            self._plan_for = meta
        return self._plan


def _causal_sdpa(q, k, v, scale: float) -> torch.Tensor:
    """q [n, hq, d], k/v [n, hkv, d] -> [n, hq, d]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def _padded_attention(q, k_flat, v_flat, batch: _PaddedBatch, scale: float) -> torch.Tensor:
    """Grouped-query attention of the padded queries over gathered keys; returns the valid rows only."""
    queries = q[batch.rows].transpose(1, 2)  # [batch, hq, max_q, d]
    keys = k_flat[batch.slots].transpose(1, 2)  # [batch, hkv, max_len, d]
    values = v_flat[batch.slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=batch.bias, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)[batch.valid]


def make_plan(meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> _Plan:
    cu = meta.cu_seqlens_q.tolist()
    seq_lens = meta.seq_lens.tolist()
    fresh: list[tuple[int, int]] = []
    short: list[int] = []
    long: list[int] = []
    for i, total in enumerate(seq_lens):
        q_len = cu[i + 1] - cu[i]
        if q_len == total:
            fresh.append((cu[i], cu[i + 1]))
        else:
            (short if q_len <= MAX_BATCHED_QUERY_LEN else long).append(i)
    groups = ([short] if short else []) + [[i] for i in long]
    return _Plan(fresh, [_padded_batch(meta, g, cu, seq_lens, block_size, dtype) for g in groups])


def _padded_batch(meta: AttentionMetadata, seqs: list[int], cu: list[int], seq_lens: list[int],
                  block_size: int, dtype: torch.dtype) -> _PaddedBatch:
    device = meta.block_tables.device
    q_lens = torch.tensor([cu[i + 1] - cu[i] for i in seqs], device=device)
    lens = torch.tensor([seq_lens[i] for i in seqs], device=device)
    starts = torch.tensor([cu[i] for i in seqs], device=device)
    max_q, max_len = int(q_lens.max()), int(lens.max())
    qpos = torch.arange(max_q, device=device)
    valid = qpos[None, :] < q_lens[:, None]
    rows = torch.where(valid, starts[:, None] + qpos[None, :], 0)
    kpos = torch.arange(max_len, device=device)
    tables = meta.block_tables[seqs].long()
    slots = torch.gather(tables, 1, (kpos // block_size).expand(len(seqs), -1)) * block_size + kpos % block_size
    # Query j of a sequence sits at position (len - q_len + j) and sees keys up to and including it.
    last_visible = (lens - q_lens)[:, None] + qpos[None, :]
    allowed = kpos[None, None, :] <= last_visible[:, :, None]
    allowed[:, :, 0] |= ~valid  # padding rows see one key, so their softmax stays finite
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return _PaddedBatch(rows, valid, rows[valid], slots, bias[:, None])
