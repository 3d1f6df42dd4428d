"""Attention in plain torch over the paged KV cache.

Each step is planned once (gather indices, masks) and the plan serves every layer. Sequences with
nothing cached attend to their own new K/V with a causal mask; all others (decodes, extends over a
cached prefix) are padded into one batch whose K/V is gathered from the cache in one indexing op.
Where several of those share cached prefix blocks, the prefix is attended once for all of them
(cascade.py) and only each sequence's suffix is gathered.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionMetadata
from .cascade import attention_with_lse, find_shared_prefixes, merge_attention_states
from .masked import MaskedPlan, make_masked_plan, masked_attention

# Extends longer than this run on their own rather than padding every row of the batch to their length.
MAX_BATCHED_QUERY_LEN = 64


@dataclass
class _SharedPrefix:
    blocks: torch.Tensor  # int64 [num_blocks]: the cached blocks every member's table starts with
    index: torch.Tensor  # int64 [n]: the members' query rows, as positions in their batch's out_rows


@dataclass
class _PaddedBatch:
    rows: torch.Tensor  # int64 [batch, max_q]: the flat query row of each (sequence, query), padding -> 0
    valid: torch.Tensor  # bool [batch, max_q]
    out_rows: torch.Tensor  # int64 [num_valid]: rows[valid]
    slots: torch.Tensor  # int64 [batch, max_len]: cache slots of each sequence's keys past its shared prefix
    bias: torch.Tensor  # float [batch, 1, max_q, max_len]: 0 where a query may attend, -inf elsewhere
    shared: list[_SharedPrefix]  # prefixes left out of slots, attended once per group and merged in


@dataclass
class _Plan:
    fresh: list[tuple[int, int]]  # query ranges with no cached prefix: causal attention over their own K/V
    batches: list[_PaddedBatch]


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, cascade: bool = True):
        self.cascade = cascade  # False: every sequence gathers its whole context (the reference for tests)
        self._plan_for: AttentionMetadata | None = None
        self._plan: _Plan | None = None
        self._masked_plans: dict[int | None, MaskedPlan] = {}  # by window, for self._plan_for

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        k_flat = k_cache.view(-1, *k_cache.shape[2:])
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        k_flat.index_copy_(0, meta.slot_mapping, k)
        v_flat.index_copy_(0, meta.slot_mapping, v)
        if window is not None or softcap is not None:
            return masked_attention(q, k_flat, v_flat, self._get_masked_plan(meta, k_cache.shape[1], window),
                                    scale, softcap)
        plan = self._get_plan(meta, k_cache.shape[1], q.dtype)
        out = torch.empty_like(q)
        for start, end in plan.fresh:
            out[start:end] = _causal_sdpa(q[start:end], k[start:end], v[start:end], scale)
        for batch in plan.batches:
            out[batch.out_rows] = _padded_attention(q, k_cache, v_cache, k_flat, v_flat, batch, scale)
        return out

    def _get_plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> _Plan:
        if self._plan is None or self._plan_for is not meta:
            self._plan = make_plan(meta, block_size, dtype, self.cascade)
            self._plan_for = meta
            self._masked_plans = {}
        return self._plan

    def _get_masked_plan(self, meta: AttentionMetadata, block_size: int, window: int | None) -> MaskedPlan:
        if self._plan_for is not meta:
            self._plan, self._plan_for, self._masked_plans = None, meta, {}
        if window not in self._masked_plans:
            self._masked_plans[window] = make_masked_plan(meta, block_size, window)
        return self._masked_plans[window]


def _causal_sdpa(q, k, v, scale: float) -> torch.Tensor:
    """q [n, hq, d], k/v [n, hkv, d] -> [n, hq, d]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def _padded_attention(q, k_cache, v_cache, k_flat, v_flat, batch: _PaddedBatch, scale: float) -> torch.Tensor:
    """Each query attends its sequence's gathered keys in the padded batch; where a group of sequences
    shares a prefix left out of the gather, the group's queries attend it in one call and the two parts
    are merged by log-sum-exp. Returns the valid rows, in out_rows order.

    Even without a shared prefix this goes through attention_with_lse: folding the query-head group into
    the query length measured 2x faster than F.scaled_dot_product_attention(enable_gqa=True) in bf16."""
    queries = q[batch.rows].transpose(1, 2)  # [batch, hq, max_q, d]
    keys = _gather_rows(k_flat, batch.slots).transpose(1, 2)  # [batch, hkv, max_len, d]
    values = _gather_rows(v_flat, batch.slots).transpose(1, 2)
    out, lse = attention_with_lse(queries, keys, values, batch.bias, scale)
    out, lse = out.transpose(1, 2)[batch.valid], lse.transpose(1, 2)[batch.valid]
    for prefix in batch.shared:
        rows = batch.out_rows[prefix.index]
        prefix_out, prefix_lse = attention_with_lse(
            q[rows].transpose(0, 1)[None], _prefix_kv(k_cache, prefix.blocks), _prefix_kv(v_cache, prefix.blocks),
            None, scale)
        out[prefix.index] = merge_attention_states(prefix_out[0].transpose(0, 1), prefix_lse[0].transpose(0, 1),
                                                   out[prefix.index], lse[prefix.index])
    return out


def _prefix_kv(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, hkv, d] gathered by whole blocks -> [1, hkv, num_blocks * block_size, d]."""
    return _gather_rows(cache, blocks).flatten(0, 1).transpose(0, 1)[None]


def _gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for an index into dim 0, as index_select over whole rows: aten::index copies element
    by element, measured 5-9x slower for these K/V gathers (1.9 ms vs 0.2 ms for 16 x 208 bf16 slots)."""
    rows = table.reshape(table.shape[0], -1).index_select(0, index.reshape(-1))
    return rows.view(*index.shape, *table.shape[1:])


def make_plan(meta: AttentionMetadata, block_size: int, dtype: torch.dtype, cascade: bool = True) -> _Plan:
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
    return _Plan(fresh, [_padded_batch(meta, g, cu, seq_lens, block_size, dtype, cascade) for g in groups])


def _padded_batch(meta: AttentionMetadata, seqs: list[int], cu: list[int], seq_lens: list[int],
                  block_size: int, dtype: torch.dtype, cascade: bool) -> _PaddedBatch:
    device = meta.block_tables.device
    q_len_list = [cu[i + 1] - cu[i] for i in seqs]
    q_lens = torch.tensor(q_len_list, device=device)
    lens = torch.tensor([seq_lens[i] for i in seqs], device=device)
    starts = torch.tensor([cu[i] for i in seqs], device=device)
    groups, skip = _shared_prefix_groups(meta, seqs, q_len_list, seq_lens, block_size, cascade)
    skipped = torch.tensor(skip, device=device) * block_size  # keys before this are in a shared prefix
    max_q, max_len = int(q_lens.max()), int((lens - skipped).max())
    qpos = torch.arange(max_q, device=device)
    valid = qpos[None, :] < q_lens[:, None]
    rows = torch.where(valid, starts[:, None] + qpos[None, :], 0)
    kpos = skipped[:, None] + torch.arange(max_len, device=device)[None, :]  # absolute key positions
    tables = meta.block_tables[seqs].long()
    block_index = (kpos // block_size).clamp_(max=tables.shape[1] - 1)  # past a sequence's end: padding
    slots = torch.gather(tables, 1, block_index) * block_size + kpos % block_size
    # Query j of a sequence sits at position (len - q_len + j) and sees keys up to and including it.
    last_visible = (lens - q_lens)[:, None] + qpos[None, :]
    allowed = kpos[:, None, :] <= last_visible[:, :, None]
    allowed[:, :, 0] |= ~valid  # padding rows see one key, so their softmax stays finite
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
    out_rows = rows[valid]
    return _PaddedBatch(rows, valid, out_rows, slots, bias[:, None], _shared_prefixes(groups, tables, valid))


def _shared_prefix_groups(meta: AttentionMetadata, seqs: list[int], q_lens: list[int], seq_lens: list[int],
                          block_size: int, cascade: bool):
    """Cascade groups among seqs (batch-local indices) and, per sequence, the blocks its group shares."""
    skip = [0] * len(seqs)
    if not cascade or len(seqs) < 2:
        return [], skip
    tables = meta.block_tables[seqs].tolist()
    cached = [(seq_lens[i] - q) // block_size for i, q in zip(seqs, q_lens)]
    groups = find_shared_prefixes(tables, cached)
    for group in groups:
        for i in group.members:
            skip[i] = group.num_blocks
    return groups, skip


def _shared_prefixes(groups, tables: torch.Tensor, valid: torch.Tensor) -> list[_SharedPrefix]:
    position = torch.cumsum(valid.flatten(), 0).view(valid.shape) - 1  # (sequence, query) -> index in out_rows
    prefixes = []
    for group in groups:
        members = torch.tensor(group.members, device=valid.device)
        index = position[members][valid[members]]
        prefixes.append(_SharedPrefix(tables[group.members[0], :group.num_blocks], index))
    return prefixes
