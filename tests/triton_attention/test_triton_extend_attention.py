"""The extend kernel matches the torch reference on ragged batches with and without cached prefixes."""
import pytest
import torch

from batchinfer.engine.kernels.extend_attention import extend_attention
from benchmarks.support.kernel_reference import extend_attention_ref

# prefixes: none, a partial block, exactly one block of 16, several blocks; new tokens: one, a
# partial tile, several tiles; one sequence brings no new token at all.
PREFIX_LENS = [0, 5, 16, 37, 9]
Q_LENS = [21, 1, 40, 6, 0]


def _check(batch, tolerance, dtype, **tiles):
    ref_k_cache, ref_v_cache = batch.stored_caches()
    m = batch.meta
    out = extend_attention(batch.q, ref_k_cache, ref_v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables,
                           m.max_seqlen_q, batch.scale, **tiles)
    expected = extend_attention_ref(batch.q, ref_k_cache, ref_v_cache, m.cu_seqlens_q, m.seq_lens,
                                    m.block_tables, batch.scale)
    torch.testing.assert_close(out, expected, **tolerance(dtype))


@pytest.mark.parametrize("block_size,group,dtype", [
    (16, 1, torch.float32), (16, 4, torch.float16), (32, 3, torch.float32), (32, 1, torch.float16),
    (16, 3, torch.bfloat16),  # the kernel upcasts to fp32 on CPU, where the interpreter's bf16 dot is wrong
])
def test_triton_extend_attends_to_cached_prefix_and_causally_to_new_tokens(paged_batch, tolerance,
                                                                          block_size, group, dtype):
    batch = paged_batch(PREFIX_LENS, Q_LENS, block_size, kv_heads=2, group=group, head_dim=32, dtype=dtype)
    _check(batch, tolerance, dtype, block_m=16, block_n=16)


def test_triton_extend_with_default_tiles_and_model_head_shape(paged_batch, tolerance):
    batch = paged_batch([0, 70], [80, 3], 16, kv_heads=3, group=3, head_dim=64, dtype=torch.float16, seed=1)
    _check(batch, tolerance, torch.float16)


def test_triton_extend_handles_head_dim_below_a_power_of_two(paged_batch, tolerance):
    batch = paged_batch([11], [9], 16, kv_heads=1, group=2, head_dim=40, dtype=torch.float32, seed=2)
    _check(batch, tolerance, torch.float32, block_m=16, block_n=16)


def test_triton_extend_without_prefix_equals_causal_sdpa(paged_batch):
    batch = paged_batch([0], [24], 16, kv_heads=2, group=2, head_dim=32, dtype=torch.float32, seed=3)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    out = extend_attention(batch.q, k_cache, v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables, m.max_seqlen_q,
                           batch.scale, block_m=16, block_n=16)
    expected = torch.nn.functional.scaled_dot_product_attention(
        batch.q.transpose(0, 1), batch.k.transpose(0, 1), batch.v.transpose(0, 1),
        is_causal=True, scale=batch.scale, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
