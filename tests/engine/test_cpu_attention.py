"""The CPU attention kernel (attention/cpu_kernel.c) against the plain torch reference on random ragged paged
batches (benchmarks/support), and its batch invariance: a token's output bits do not depend on what else is in
the call, nor on whether it is a decode or the last row of a prefill, nor on the CPU's vector width."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from batchinfer.engine.attention import make_attention_backend
from batchinfer.engine.attention.cpu_backend import CpuAttentionBackend, keys_in_base_layout, keys_in_kernel_layout
from batchinfer.engine.attention.torch_backend import TorchAttentionBackend
from batchinfer.engine.machine.native_build import avx512_supported, cpu_supported
from benchmarks.support.kernel_reference import extend_attention_ref, store_kv_ref
from benchmarks.support.paged_batch import PagedBatch

pytestmark = [pytest.mark.fast,
              pytest.mark.skipif(not cpu_supported(), reason="the CPU kernels need avx2, fma and f16c")]
BLOCK_SIZES = [16, 4, 32, 16]  # a kernel vector's 16 keys in one block, or copied from four

@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def backend(cache_dir) -> CpuAttentionBackend:
    return CpuAttentionBackend(cache_dir)


@pytest.fixture(scope="module")
def avx2_backend(cache_dir) -> CpuAttentionBackend:
    return CpuAttentionBackend(cache_dir, avx2_only=True)


def random_step(rng: random.Random) -> tuple[list[int], list[int]]:
    """(cached prefix, new tokens) per sequence: decodes, fresh prefills, short and long extends."""
    prefixes, q_lens = [], []
    for _ in range(rng.randrange(1, 7)):
        kind = rng.choice(["decode", "fresh", "extend", "long_extend"])
        prefixes.append(0 if kind == "fresh" else rng.randrange(1, 40))
        q_lens.append({"decode": 1, "fresh": rng.randrange(1, 30), "extend": rng.randrange(2, 20),
                       "long_extend": rng.randrange(65, 90)}[kind])
    return prefixes, q_lens


def run_kernel(backend, batch: PagedBatch, window=None, softcap=None) -> tuple[torch.Tensor, torch.Tensor,
                                                                               torch.Tensor]:
    """The output and the caches after the call, keys read back in the base layout."""
    k_cache, v_cache = keys_in_kernel_layout(batch.k_cache), batch.v_cache.clone()
    out = backend.forward(batch.q, batch.k, batch.v, k_cache, v_cache, batch.meta, batch.scale, window, softcap)
    return out, keys_in_base_layout(k_cache), v_cache


@pytest.mark.parametrize("head_dim", [16, 64, 128, 48])  # 64 and 128 are compiled apart; 16 and 48 the general loop
@pytest.mark.parametrize("seed", range(4))
def test_ragged_batch_matches_reference(backend, seed, head_dim):
    prefixes, q_lens = random_step(random.Random(seed))
    batch = PagedBatch(prefixes, q_lens, BLOCK_SIZES[seed], 2, 3, head_dim, torch.float32, seed=seed)
    window, softcap = [(None, None), (7, None), (None, 2.5), (13, 4.0)][seed]
    out, k_cache, v_cache = run_kernel(backend, batch, window, softcap)
    stored = batch.stored_caches()
    assert torch.equal(k_cache, stored[0]) and torch.equal(v_cache, stored[1]), "new K/V belong at slot_mapping"
    meta = batch.meta
    expected = extend_attention_ref(batch.q.double(), stored[0].double(), stored[1].double(), meta.cu_seqlens_q,
                                    meta.seq_lens, meta.block_tables, batch.scale, window, softcap)
    torch.testing.assert_close(out, expected.float(), atol=2e-6, rtol=1e-5)


def test_a_head_size_the_kernel_does_not_take_runs_on_the_torch_backend(backend):
    batch = PagedBatch([5, 0], [1, 12], 16, 2, 3, 40, torch.float32, seed=1)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    out = backend.forward(batch.q, batch.k, batch.v, k_cache, v_cache, batch.meta, batch.scale)
    expected = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, batch.meta,
                                               batch.scale)
    assert torch.equal(out, expected) and torch.equal(k_cache, batch.k_cache)


@pytest.mark.skipif(not avx512_supported(), reason="compares the AVX-512 build with the AVX2 one")
@pytest.mark.parametrize("seed", range(4))
def test_the_avx2_and_avx512_builds_give_the_same_bits(backend, avx2_backend, seed):
    """A worker's CPU does not change a token's output: both builds do the same arithmetic lane by lane."""
    prefixes, q_lens = random_step(random.Random(seed + 10))
    batch = PagedBatch(prefixes, q_lens, 32, 2, 4, [64, 128, 48, 64][seed], torch.float32, seed=seed)
    window, softcap = [(None, None), (9, None), (None, 3.0), (21, 5.0)][seed]
    wide, narrow = (run_kernel(b, batch, window, softcap) for b in (backend, avx2_backend))
    assert all(torch.equal(a, b) for a, b in zip(wide, narrow))


@pytest.mark.parametrize("which", ["best", "avx2"])
def test_a_token_gets_the_same_bits_alone_beside_others_and_inside_a_prefill(backend, avx2_backend, which):
    """Sequence 0's last token (37 positions) as a decode alone, as a decode beside a mixed batch, and as the
    last row of a prefill of its whole sequence, each in blocks of 16, 4 and 32: its keys and values are the same
    each time, in other blocks."""
    kernel = backend if which == "best" else avx2_backend
    length, heads, d = 37, 2, 64
    gen = torch.Generator().manual_seed(7)
    keys, values, queries = (torch.randn(length, heads, d, generator=gen) for _ in range(3))
    queries = torch.randn(length, heads * 3, d, generator=gen)
    outputs = []
    arrangements = [([36], [1]), ([36, 15, 49, 14], [1, 5, 1, 30]), ([0], [37])]
    for seed, ((prefixes, q_lens), block_size) in enumerate(itertools.product(arrangements, BLOCK_SIZES[:3])):
        batch = PagedBatch(prefixes, q_lens, block_size, heads, 3, d, torch.float32, seed=seed)
        new = q_lens[0]
        batch.q[:new], batch.k[:new], batch.v[:new] = queries[-new:], keys[-new:], values[-new:]
        slots = _slots(batch, 0, length)
        store_kv_ref(keys[:-new], values[:-new], batch.k_cache, batch.v_cache, slots[:-new])  # the cached prefix
        out, _, _ = run_kernel(kernel, batch)
        outputs.append(out[new - 1])
    assert all(torch.equal(outputs[0], other) for other in outputs[1:])


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
