"""The Triton backend and the engine's torch backend agree through the AttentionBackend interface."""
import pytest
import torch

from batchinfer.engine.attention.torch_backend import TorchAttentionBackend
from batchinfer.engine.attention.triton_backend import TritonAttentionBackend

CASES = {
    "prefill": ([0, 0], [13, 30]),
    "extend_over_cached_prefix": ([16, 21, 0], [5, 1, 9]),
    "decode": ([0, 15, 31, 64], [1, 1, 1, 1]),
    "decode_tokens_beside_a_prefill_chunk": ([10, 47, 16], [1, 1, 12]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_backend_agrees_with_torch_backend(paged_batch, tolerance, case, dtype):
    prefix_lens, q_lens = CASES[case]
    batch = paged_batch(prefix_lens, q_lens, 16, kv_heads=3, group=3, head_dim=64, dtype=dtype)
    args = (batch.q, batch.k, batch.v)
    torch_k_cache, torch_v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    expected = TorchAttentionBackend().forward(*args, torch_k_cache, torch_v_cache, batch.meta, batch.scale)
    out = TritonAttentionBackend().forward(*args, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    torch.testing.assert_close(out, expected, **tolerance(dtype))
    assert torch.equal(batch.k_cache, torch_k_cache) and torch.equal(batch.v_cache, torch_v_cache)
