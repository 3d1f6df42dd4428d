"""The flash-decoding kernel matches the torch reference for any GQA ratio and number of splits."""
import pytest
import torch

from batchinfer.engine.kernels.decode_attention import decode_attention
from benchmarks.support.kernel_reference import decode_attention_ref

# context lengths: a single token, a partial block, exactly one block, one past a block, several blocks
PREFIX_LENS = [0, 14, 15, 16, 90]


@pytest.mark.parametrize("block_size,group,dtype,num_splits", [
    (16, 1, torch.float32, 1), (16, 3, torch.float16, 4), (32, 4, torch.float16, None), (32, 3, torch.float32, 7),
    (16, 3, torch.bfloat16, 2),
])
def test_triton_decode_matches_reference(paged_batch, tolerance, block_size, group, dtype, num_splits):
    batch = paged_batch(PREFIX_LENS, [1] * len(PREFIX_LENS), block_size, kv_heads=2, group=group, head_dim=32,
                        dtype=dtype)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    out = decode_attention(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, m.max_seq_len, batch.scale,
                           num_splits=num_splits, block_n=16)
    expected = decode_attention_ref(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, batch.scale)
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_triton_decode_with_more_splits_than_tiles_leaves_empty_splits_out(paged_batch, tolerance):
    batch = paged_batch([2, 40], [1, 1], 16, kv_heads=3, group=3, head_dim=64, dtype=torch.float16, seed=1)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    out = decode_attention(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, m.max_seq_len, batch.scale,
                           num_splits=8)
    expected = decode_attention_ref(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, batch.scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, **tolerance(torch.float16))
