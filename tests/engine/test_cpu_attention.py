"""The CPU attention kernel (attention/cpu_kernel.c) against the plain torch reference on random ragged paged
batches (benchmarks/support), and its batch invariance: a token's output bits do not depend on what else is in
the call, nor on whether it is a decode or the last row of a prefill."""
from __future__ import annotations

import random

import pytest
import torch

from batchinfer.engine.attention import make_attention_backend
from batchinfer.engine.attention.cpu_backend import CpuAttentionBackend
from batchinfer.engine.attention.torch_backend import TorchAttentionBackend
from batchinfer.engine.machine.native_build import cpu_supported
from benchmarks.support.kernel_reference import extend_attention_ref, store_kv_ref
from benchmarks.support.paged_batch import PagedBatch

pytestmark = [pytest.mark.fast,
              pytest.mark.skipif(not cpu_supported(), reason="the CPU kernels need avx2, fma and f16c")]


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> CpuAttentionBackend:
    return CpuAttentionBackend(str(tmp_path_factory.mktemp("cache")))


def random_step(rng: random.Random) -> tuple[list[int], list[int]]:
    """(cached prefix, new tokens) per sequence: decodes, fresh prefills, short and long extends."""
    prefixes, q_lens = [], []
    for _ in range(rng.randrange(1, 7)):
        kind = rng.choice(["decode", "fresh", "extend", "long_extend"])
        prefixes.append(0 if kind == "fresh" else rng.randrange(1, 40))
        q_lens.append({"decode": 1, "fresh": rng.randrange(1, 30), "extend": rng.randrange(2, 20),
                       "long_extend": rng.randrange(65, 90)}[kind])
    return prefixes, q_lens


@pytest.mark.parametrize("head_dim", [8, 64, 128, 40])  # 64 and 128 are compiled apart; 8 and 40 the general loop
@pytest.mark.parametrize("seed", range(4))
def test_ragged_batch_matches_reference(backend, seed, head_dim):
    prefixes, q_lens = random_step(random.Random(seed))
    batch = PagedBatch(prefixes, q_lens, 4, 2, 3, head_dim, torch.float32, seed=seed)
    window, softcap = [(None, None), (7, None), (None, 2.5), (13, 4.0)][seed]
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    out = backend.forward(batch.q, batch.k, batch.v, k_cache, v_cache, batch.meta, batch.scale, window, softcap)
    stored = batch.stored_caches()
    assert torch.equal(k_cache, stored[0]) and torch.equal(v_cache, stored[1]), "new K/V belong at slot_mapping"
    meta = batch.meta
    expected = extend_attention_ref(batch.q.double(), stored[0].double(), stored[1].double(), meta.cu_seqlens_q,
                                    meta.seq_lens, meta.block_tables, batch.scale, window, softcap)
    torch.testing.assert_close(out, expected.float(), atol=2e-6, rtol=1e-5)


def test_a_token_gets_the_same_bits_alone_beside_others_and_inside_a_prefill(backend):
    """Sequence 0's last token (37 positions) as a decode alone, as a decode beside a mixed batch, and as the
    last row of a prefill of its whole sequence: its keys and values are the same each time, in other blocks."""
    length, heads, d = 37, 2, 64
    gen = torch.Generator().manual_seed(7)
    keys, values, queries = (torch.randn(length, heads, d, generator=gen) for _ in range(3))
    queries = torch.randn(length, heads * 3, d, generator=gen)
    outputs = []
    for seed, (prefixes, q_lens) in enumerate([([36], [1]), ([36, 15, 49, 14], [1, 5, 1, 30]), ([0], [37])]):
        batch = PagedBatch(prefixes, q_lens, 4, heads, 3, d, torch.float32, seed=seed)
        new = q_lens[0]
        batch.q[:new], batch.k[:new], batch.v[:new] = queries[-new:], keys[-new:], values[-new:]
        slots = _slots(batch, 0, length)
        store_kv_ref(keys[:-new], values[:-new], batch.k_cache, batch.v_cache, slots[:-new])  # the cached prefix
        out = backend.forward(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
        outputs.append(out[new - 1])
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])


def _slots(batch: PagedBatch, seq: int, length: int) -> torch.Tensor:
    block_size = batch.k_cache.shape[1]
    pos = torch.arange(length)
    return batch.meta.block_tables[seq, pos // block_size].long() * block_size + pos % block_size


def test_auto_picks_the_kernel_for_float32_on_cpu_only(tmp_path):
    assert isinstance(make_attention_backend("auto", "cpu", str(tmp_path)), CpuAttentionBackend)
    assert isinstance(make_attention_backend("auto", "cpu", str(tmp_path), torch.bfloat16), TorchAttentionBackend)
    assert isinstance(make_attention_backend("torch", "cpu", str(tmp_path)), TorchAttentionBackend)


def test_bfloat16_takes_the_torch_backend(backend):
    batch = PagedBatch([11, 11], [1, 9], 4, 2, 3, 64, torch.bfloat16, seed=3)
    args = batch.q, batch.k, batch.v
    expected = TorchAttentionBackend().forward(*args, batch.k_cache.clone(), batch.v_cache.clone(), batch.meta, 0.3)
    assert torch.equal(backend.forward(*args, batch.k_cache, batch.v_cache, batch.meta, 0.3), expected)


@pytest.mark.parametrize("tokens,hq,hkv,d", [(1, 9, 3, 64), (70, 32, 8, 64), (5, 4, 2, 128), (3, 2, 1, 40)])
def test_rope_matches_the_torch_form_bit_for_bit(backend, tokens, hq, hkv, d):
    """The kernel's RoPE (q and k written contiguous) against the base backend's torch RoPE, on the decoder's
    strided view of a fused qkv output; 70 tokens run on the threads."""
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, hq + 2 * hkv, d, generator=gen) * 10
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    angles = torch.outer(torch.arange(4096).float(), inv_freq).repeat(1, 2)
    cos, sin = angles.cos()[:, None, :][positions], angles.sin()[:, None, :][positions]
    q, k = backend.rope(qkv[:, :hq + hkv], cos, sin, hq)
    q_ref, k_ref = TorchAttentionBackend().rope(qkv[:, :hq + hkv], cos, sin, hq)
    assert q.is_contiguous() and k.is_contiguous()
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
