"""Plain torch references for the Triton kernels (batchinfer/engine/kernels): slow, obvious, and what the
kernel tests (tests/triton_attention) and benchmarks/gpu_check.py compare against.

KV cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim]; slot s is block
s // block_size, offset s % block_size.
"""
from __future__ import annotations

import torch


def store_kv_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write each new token's K/V row into its cache slot; a negative slot means padding (skipped)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]


def gather_kv_ref(cache, block_table, seq_len: int) -> torch.Tensor:
    """The first seq_len tokens of one sequence, read through its block table: [seq_len, heads, dim]."""
    block_size = cache.shape[1]
    pos = torch.arange(seq_len, device=cache.device)
    slots = block_table[pos // block_size].long() * block_size + pos % block_size
    return cache.view(-1, *cache.shape[2:])[slots]


def extend_attention_ref(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window=None,
                         softcap=None) -> torch.Tensor:
    """Each sequence's new tokens attend to its whole cached context (prefix + new tokens already
    stored), causally: new token i sits at absolute position prefix_len + i. Computed in fp32. With a
    window, the token at p sees keys p - window < j <= p; with a softcap, scores become
    softcap * tanh(score / softcap)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[2]
    for b in range(len(seq_lens)):
        start, end = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        seq_len, q_len = int(seq_lens[b]), end - start
        if q_len == 0:
            continue
        keys = gather_kv_ref(k_cache, block_tables[b], seq_len).float().repeat_interleave(group, dim=1)
        values = gather_kv_ref(v_cache, block_tables[b], seq_len).float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), keys) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        hidden = (k_pos > q_pos) | (k_pos <= q_pos - window) if window is not None else k_pos > q_pos
        scores = scores.masked_fill(hidden, float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values).to(q.dtype)
    return out


def decode_attention_ref(q, k_cache, v_cache, seq_lens, block_tables, scale, window=None,
                         softcap=None) -> torch.Tensor:
    """One new token per sequence (q: [batch, q_heads, dim]) over its seq_lens[b] cached tokens."""
    cu_seqlens_q = torch.arange(len(seq_lens) + 1, device=q.device, dtype=torch.int32)
    return extend_attention_ref(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, window, softcap)
