"""Decode attention kernel (flash decoding): one new token per sequence over its paged KV. Stage 1
splits each sequence along its length and lets every program attend, for one KV head, with all the
query heads that share it (any GQA ratio); stage 2 merges the splits by their log-sum-exp.
Batch-invariant: splits are a fixed SPLIT_LEN positions each (split s holds [s * SPLIT_LEN, (s+1) * SPLIT_LEN),
whatever the batch), and stage 2 adds them in split order, so a longer neighbour only adds empty splits,
which add exact zeros.
A sliding window skips keys at or before seq_len - 1 - window; a soft-cap maps each score s to
softcap * tanh(s / softcap).
Its torch reference, which the tests compare against: benchmarks/support/kernel_reference.py:decode_attention_ref."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .extend_attention import NO_WINDOW, scores_log2, softcap_factors


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, seq_lens_ptr, block_tables_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, split_len, window, cap_in, cap_out,
    stride_qb, stride_qh, stride_cache_block, stride_cache_token, stride_cache_head, stride_block_table,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    split_end = tl.minimum(seq_len, split * split_len + split_len)
    split_start = tl.maximum(split * split_len, seq_len - window)  # keys before the window are skipped

    offs_h = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + offs_h
    mask_h = offs_h < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:  # the interpreter gets bf16 dot products wrong; fp32 is exact there
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], -1e30, tl.float32)  # finite, so an empty split stays NaN-free
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)

    table = block_tables_ptr + seq.to(tl.int64) * stride_block_table
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(split_start, split_end, BLOCK_N):
        pos = start + offs_n
        mask_n = pos < split_end
        block = tl.load(table + pos // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
        rows = block * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_token + kv_head * stride_cache_head
        tile_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + rows[:, None] + offs_d[None, :], mask=tile_mask, other=0.0)
        v = tl.load(v_cache_ptr + rows[:, None] + offs_d[None, :], mask=tile_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = scores_log2(tl.dot(q, tl.trans(k), input_precision=PRECISION), scale_log2, cap_in, cap_out, SOFTCAP)
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    lse = tl.where(l_i > 0.0, m_i + tl.math.log2(tl.maximum(l_i, 1e-30)), float("-inf"))  # log2 units
    part = part_out_ptr + seq.to(tl.int64) * stride_pb + heads * stride_ph + split * stride_ps
    tl.store(part[:, None] + offs_d[None, :], acc, mask=mask_h[:, None] & mask_d[None, :])
    tl.store(part_lse_ptr + seq.to(tl.int64) * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, o_ptr, num_splits,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + offs_h
    mask_h = offs_h < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    lse_row = part_lse_ptr + seq.to(tl.int64) * stride_lb + heads * stride_lh
    top = tl.full([BLOCK_H], -1e30, tl.float32)  # a max is exact in any order
    for s in range(0, num_splits):
        top = tl.maximum(top, tl.load(lse_row + s, mask=mask_h, other=float("-inf")))
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    part = part_out_ptr + seq.to(tl.int64) * stride_pb + heads[:, None] * stride_ph + offs_d[None, :]
    for s in range(0, num_splits):  # in split order: the same sum whatever num_splits the batch needed
        weight = tl.math.exp2(tl.load(lse_row + s, mask=mask_h, other=float("-inf")) - top)  # 0 for empty splits
        total += weight
        acc += weight[:, None] * tl.load(part + s * stride_ps, mask=mask_h[:, None] & mask_d[None, :], other=0.0)
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(o_ptr + seq.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=(offs_h < GROUP)[:, None] & mask_d[None, :])


SPLIT_LEN = 256  # positions per split: fixed, so a sequence's splits do not depend on its neighbours


def decode_attention(q, k_cache, v_cache, seq_lens, block_tables, max_seq_len: int, scale: float,
                     split_len: int = SPLIT_LEN, block_n: int = 32, window: int | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """q: [batch, q_heads, dim], one new token per sequence whose K/V are already in the cache;
    seq_lens[b] tokens of sequence b are read through block_tables[b]. Returns like q. block_n = 32 keeps
    the split kernel's sm_90 build at ~120 (head_dim 64) to ~200 (128) registers without spills."""
    batch, q_heads, dim = q.shape
    out = torch.empty_like(q)
    if batch == 0:
        return out
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(2) == 1
    kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = q_heads // kv_heads
    assert split_len % block_n == 0, "a split is whole tiles"
    num_splits = triton.cdiv(max(max_seq_len, 1), split_len)
    part_out = torch.empty(batch, q_heads, num_splits, dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(batch, q_heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(dim)
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, seq_lens, block_tables, part_out, part_lse, scale * math.log2(math.e), split_len,
        window or NO_WINDOW, *softcap_factors(scale, softcap),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_SIZE=block_size, HEAD_DIM=dim,
        BLOCK_D=block_d, BLOCK_N=block_n, SOFTCAP=softcap is not None, UPCAST=q.device.type == "cpu",
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 in, fp32-exact dots
    )
    _decode_reduce_kernel[(batch, kv_heads)](
        part_out, part_lse, out, num_splits,
        part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_H=max(2, triton.next_power_of_2(group)), HEAD_DIM=dim, BLOCK_D=block_d,
    )
    return out
