"""Sliding windows (Mistral, Gemma) and soft-capped scores (Gemma 2) in the Triton kernels, against the torch
reference: windows shorter than, across and longer than the cached prefix, with and without a cap."""
import pytest
import torch

from batchinfer.engine.kernels.extend_attention import extend_attention
from benchmarks.support.kernel_reference import decode_attention_ref, extend_attention_ref

PREFIX_LENS = [0, 5, 16, 37, 9]
Q_LENS = [21, 1, 40, 6, 3]


@pytest.mark.parametrize("window,softcap,dtype", [
    (7, None, torch.float32), (16, None, torch.float16), (20, 5.0, torch.float32), (None, 2.0, torch.float32),
    (1, None, torch.float32),
])
def test_triton_extend_honours_window_and_softcap(paged_batch, tolerance, window, softcap, dtype):
    batch = paged_batch(PREFIX_LENS, Q_LENS, 16, kv_heads=2, group=3, head_dim=32, dtype=dtype, seed=4)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    out = extend_attention(batch.q, k_cache, v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables, m.max_seqlen_q,
                           batch.scale, block_m=16, block_n=16, window=window, softcap=softcap)
    expected = extend_attention_ref(batch.q, k_cache, v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables,
                                    batch.scale, window, softcap)
    unwindowed = extend_attention_ref(batch.q, k_cache, v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables,
                                      batch.scale)
    assert not torch.allclose(expected, unwindowed, **tolerance(dtype)), "the case must exercise the mask or cap"
    torch.testing.assert_close(out, expected, **tolerance(dtype))


@pytest.mark.parametrize("window,softcap,block_n", [(7, None, 64), (16, 5.0, 16), (40, None, 32), (None, 2.0, 16)])
def test_triton_decode_honours_window_and_softcap(paged_batch, tolerance, window, softcap, block_n):
    batch = paged_batch([0, 14, 15, 16, 90], [1] * 5, 16, kv_heads=2, group=2, head_dim=32, dtype=torch.float32,
                        seed=5)
    k_cache, v_cache = batch.stored_caches()
    m = batch.meta
    out = extend_attention(batch.q, k_cache, v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables, m.max_seqlen_q,
                           batch.scale, block_n=block_n, window=window, softcap=softcap)
    expected = decode_attention_ref(batch.q, k_cache, v_cache, m.seq_lens, m.block_tables, batch.scale, window,
                                    softcap)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, **tolerance(torch.float32))
