"""Store kernel: write the new tokens' K and V rows into their paged-cache slots.
Its torch reference, which the tests compare against: benchmarks/support/kernel_reference.py:store_kv_ref."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_k, stride_v,
    ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < tl.where(slot >= 0, ROW, 0)  # a negative slot marks a padding token: store nothing
    k = tl.load(k_ptr + token.to(tl.int64) * stride_k + offs, mask=mask)
    v = tl.load(v_ptr + token.to(tl.int64) * stride_v + offs, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, v, mask=mask)


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """k, v: [num_tokens, num_kv_heads, head_dim]; caches: [num_blocks, block_size, num_kv_heads, head_dim]."""
    num_tokens, heads, dim = k.shape
    if num_tokens == 0:
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    k, v = (x.reshape(num_tokens, heads * dim) for x in (k, v))  # a view when each token's row is contiguous
    k, v = (x if x.stride(1) == 1 else x.contiguous() for x in (k, v))
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
        ROW=heads * dim, BLOCK=triton.next_power_of_2(heads * dim),
    )
