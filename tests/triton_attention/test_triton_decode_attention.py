"""The flash-decoding kernel matches the torch reference for any GQA ratio and split length, and gives a
sequence bitwise the same output whatever shares its batch."""
import pytest
import torch

from batchinfer.engine.kernels.decode_attention import decode_attention
from benchmarks.support.kernel_reference import decode_attention_ref

# context lengths: a single token, a partial block, exactly one block, one past a block, several blocks
PREFIX_LENS = [0, 14, 15, 16, 90]


@pytest.mark.parametrize("block_size,group,dtype,split_len", [
    (16, 1, torch.float32, 256), (16, 3, torch.float16, 32), (32, 4, torch.float16, 256), (32, 3, torch.float32, 16),
    (16, 3, torch.bfloat16, 48),
])
def test_triton_decode_matches_reference(paged_batch, tolerance, block_size, group, dtype, split_len):
    batch = paged_batch(PREFIX_LENS, [1] * len(PREFIX_LENS), block_size, kv_heads=2, group=group, head_dim=32,
                        dtype=dtype)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    out = decode_attention(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, m.max_seq_len, batch.scale,
                           split_len=split_len, block_n=16)
    expected = decode_attention_ref(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, batch.scale)
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_triton_decode_with_more_splits_than_tiles_leaves_empty_splits_out(paged_batch, tolerance):
    batch = paged_batch([2, 40], [1, 1], 16, kv_heads=3, group=3, head_dim=64, dtype=torch.float16, seed=1)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    out = decode_attention(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, m.max_seq_len, batch.scale,
                           split_len=16, block_n=16)
    expected = decode_attention_ref(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, batch.scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, **tolerance(torch.float16))


def test_triton_decode_output_of_a_sequence_does_not_depend_on_its_batch(paged_batch):
    """The short sequence alone and beside a longer one (more splits, a larger grid): bitwise equal."""
    batch = paged_batch([20, 100], [1, 1], 16, kv_heads=2, group=3, head_dim=32, dtype=torch.float32, seed=2)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    both = decode_attention(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, m.max_seq_len, batch.scale,
                            split_len=32, block_n=16)
    alone = decode_attention(batch.q[:1], k_cache, v_cache, m.seq_lens[:1], m.block_tables[:1],
                             int(m.seq_lens[0]), batch.scale, split_len=32, block_n=16)
    assert torch.equal(alone[0], both[0])
