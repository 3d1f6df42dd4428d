"""The store kernel writes exactly the new tokens' slots, for several block sizes and dtypes."""
import pytest
import torch

from batchinfer.engine.kernels.store_kv import store_kv


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_store_kv_writes_new_tokens_into_their_slots(paged_batch, block_size, dtype):
    batch = paged_batch([0, 5, 16, 40], [7, 1, 16, 3], block_size, kv_heads=2, group=1, head_dim=32, dtype=dtype)
    expected_k, expected_v = batch.stored_caches()
    store_kv(batch.k, batch.v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping)
    assert torch.equal(batch.k_cache, expected_k)
    assert torch.equal(batch.v_cache, expected_v)


def test_triton_store_kv_skips_padding_slots(paged_batch):
    batch = paged_batch([3, 0], [4, 2], 16, kv_heads=3, group=1, head_dim=64, dtype=torch.float16)
    batch.meta.slot_mapping[1] = -1
    expected_k, expected_v = batch.stored_caches()
    before = batch.k_cache.clone()
    store_kv(batch.k, batch.v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping)
    assert torch.equal(batch.k_cache, expected_k) and torch.equal(batch.v_cache, expected_v)
    assert not torch.equal(batch.k_cache, before)


def test_triton_store_kv_accepts_strided_rows_from_a_fused_projection(paged_batch):
    batch = paged_batch([2], [5], 16, kv_heads=2, group=1, head_dim=32, dtype=torch.float32)
    qkv = torch.cat([batch.k.flatten(1), batch.v.flatten(1)], dim=1)  # k and v as column slices
    k, v = qkv[:, :64].view(5, 2, 32), qkv[:, 64:].view(5, 2, 32)
    expected_k, expected_v = batch.stored_caches()
    store_kv(k, v, batch.k_cache, batch.v_cache, batch.meta.slot_mapping)
    assert torch.equal(batch.k_cache, expected_k) and torch.equal(batch.v_cache, expected_v)
