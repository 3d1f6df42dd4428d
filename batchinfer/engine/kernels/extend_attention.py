"""Extend attention kernel: each sequence's new tokens attend, causally, to everything before them in the
paged cache (its cached prefix and the new tokens, which the backend stores first). This is prefill, with or
without a cached prefix, and, with one new token per sequence, decode.

Batch- and cache-invariant by construction: every key is read through the block table in tiles of BLOCK_N
positions aligned at absolute position 0, whatever part of the sequence was cached or arrived in this step,
and tiles a row cannot see add exact zeros (its max, sum and accumulator are left bitwise unchanged). So a
token at position p gets the same arithmetic in a fresh prefill, an extend over a cached prefix, a recompute
after preemption and a decode step, beside any neighbours (tests/triton_attention, bitwise).

A program owns one KV head and BLOCK_M rows: TOKENS_M tokens x the query heads that share that KV
head (GQA packed, BLOCK_G = GROUP rounded up to a power of 2), so each K/V tile is loaded once per group.
A sliding window hides keys at or before position p - window from the token at p; a soft-cap maps each
score s to softcap * tanh(s / softcap) (Gemma 2).
Its torch reference, which the tests compare against: benchmarks/support/kernel_reference.py:extend_attention_ref."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


NO_WINDOW = 1 << 30  # the window of a layer that attends to every earlier token


@triton.jit
def scores_log2(qk, scale_log2, cap_in, cap_out, SOFTCAP: tl.constexpr):
    """Raw dot products -> scaled scores in log2 units; with SOFTCAP, softcap * tanh(scale * qk / softcap)
    (cap_in = scale / softcap, cap_out = softcap * log2(e)), tanh written as 2 * sigmoid(2x) - 1."""
    if SOFTCAP:
        return (2.0 * tl.sigmoid(2.0 * qk * cap_in) - 1.0) * cap_out
    return qk * scale_log2


@triton.jit
def _attend(q, k, v, mask, acc, m_i, l_i, scale_log2, cap_in, cap_out, SOFTCAP: tl.constexpr,
            UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step of q [M, D] over a tile k, v [N, D]; mask [M, N] marks visible keys."""
    if UPCAST:  # the interpreter gets bf16 dot products wrong; fp32 is exact there
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk = scores_log2(tl.dot(q, tl.trans(k), input_precision=PRECISION), scale_log2, cap_in, cap_out, SOFTCAP)
    qk = tl.where(mask, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _extend_attention_kernel(
    q_ptr, o_ptr, k_cache_ptr, v_cache_ptr,
    cu_seqlens_q_ptr, seq_lens_ptr, block_tables_ptr, scale_log2, window, cap_in, cap_out,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cache_block, stride_cache_token, stride_cache_head, stride_block_table,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, TOKENS_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    seq, kv_head, m_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len
    if m_block * TOKENS_M >= q_len:
        return

    rows = tl.arange(0, BLOCK_M)
    offs_m = m_block * TOKENS_M + rows // BLOCK_G  # each row's token within the sequence's new tokens
    pos_m = prefix_len + offs_m  # and its absolute position
    heads = kv_head * GROUP + rows % BLOCK_G
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_m = (offs_m < q_len) & (rows % BLOCK_G < GROUP)
    tokens_m = (q_start + offs_m).to(tl.int64)
    q_rows = tokens_m * stride_qt + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)  # finite, so rows with nothing visible yet stay NaN-free
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Keys from the first one the block's first token sees to the last one its last token sees, in tiles
    # aligned at position 0 (never at the prefix's end: that would make the order depend on the cache).
    table = block_tables_ptr + seq.to(tl.int64) * stride_block_table
    first_key = tl.maximum(prefix_len + m_block * TOKENS_M - window + 1, 0)
    last_key = tl.minimum(seq_len, prefix_len + (m_block + 1) * TOKENS_M)
    for start in range(first_key // BLOCK_N * BLOCK_N, last_key, BLOCK_N):
        pos = start + offs_n
        mask_n = pos < seq_len
        block = tl.load(table + pos // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
        kv_rows = block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_token + kv_head * stride_cache_head
        tile_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + kv_rows[:, None] + offs_d[None, :], mask=tile_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_rows[:, None] + offs_d[None, :], mask=tile_mask, other=0.0)
        visible = mask_n[None, :] & (pos[None, :] <= pos_m[:, None]) & (pos[None, :] > pos_m[:, None] - window)
        acc, m_i, l_i = _attend(q, k, v, visible, acc, m_i, l_i, scale_log2, cap_in, cap_out, SOFTCAP, UPCAST,
                                PRECISION)

    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_rows = tokens_m * stride_ot + heads * stride_oh
    tl.store(o_ptr + o_rows[:, None] + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_d[None, :])


def extend_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q: int,
                     scale: float, block_m: int | None = None, block_n: int = 64, window: int | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """q: [num_tokens, q_heads, dim]; caches [num_blocks, block_size, kv_heads, dim] hold each sequence's
    seq_lens[b] tokens, the new ones included (stored before the call). Returns like q.
    block_m: rows per program (tokens x packed query heads); block_n: keys per tile. The defaults keep
    sm_90 builds at <200 registers without spills (checked with cuobjdump), and small in the interpreter.
    Callers that want invariance keep block_m and block_n the same for every step (the backend does)."""
    out = torch.empty_like(q)
    num_tokens, q_heads, dim = q.shape
    if num_tokens == 0:
        return out
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(2) == 1
    batch, kv_heads, block_size = len(seq_lens), k_cache.shape[2], k_cache.shape[1]
    group = q_heads // kv_heads
    block_g = triton.next_power_of_2(group)
    block_m = max(block_m or (128 if dim <= 64 and q.device.type != "cpu" else 64), block_g)
    grid = (batch, kv_heads, triton.cdiv(max_seqlen_q, block_m // block_g))
    _extend_attention_kernel[grid](
        q, out, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale * math.log2(math.e),
        window or NO_WINDOW, *softcap_factors(scale, softcap),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, BLOCK_G=block_g, BLOCK_SIZE=block_size, HEAD_DIM=dim, BLOCK_D=triton.next_power_of_2(dim),
        BLOCK_M=block_m, TOKENS_M=block_m // block_g, BLOCK_N=block_n, SOFTCAP=softcap is not None,
        UPCAST=q.device.type == "cpu",
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 in, fp32-exact dots
        num_warps=8,
    )
    return out


def softcap_factors(scale: float, softcap: float | None) -> tuple[float, float]:
    """scores_log2's cap_in and cap_out (unused without a soft-cap)."""
    return (scale / softcap, softcap * math.log2(math.e)) if softcap else (0.0, 0.0)
