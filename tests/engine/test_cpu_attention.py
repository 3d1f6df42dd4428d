"""The CPU attention kernel (attention/cpu_kernel.c) against a naive per-token reference on random ragged paged
batches, and its batch invariance: a token's output bits do not depend on what else is in the call."""
from __future__ import annotations

import random

import pytest
import torch

from batchinfer.engine.attention import make_attention_backend
from batchinfer.engine.attention.base import AttentionMetadata
from batchinfer.engine.attention.cpu_backend import CpuAttentionBackend
from batchinfer.engine.attention.torch_backend import TorchAttentionBackend
from batchinfer.engine.native_build import cpu_supported

pytestmark = [pytest.mark.fast,
              pytest.mark.skipif(not cpu_supported(), reason="the CPU kernels need avx2, fma and f16c")]

BLOCK, HQ, HKV, NUM_BLOCKS = 4, 6, 2, 256


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> CpuAttentionBackend:
    return CpuAttentionBackend(str(tmp_path_factory.mktemp("kernels")))


def build_batch(rng: random.Random, q_lens: list[int], seq_lens: list[int]):
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)
    tables, slots = [], []
    for q_len, total in zip(q_lens, seq_lens):
        table = [free.pop() for _ in range(-(-total // BLOCK))]
        tables.append(table)
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total - q_len, total)]
    width = max(len(t) for t in tables)
    cu = [0]
    for q_len in q_lens:
        cu.append(cu[-1] + q_len)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots), cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_seqlen_q=max(q_lens), max_seq_len=max(seq_lens)), tables


def reference(q, k_cache, v_cache, tables, q_lens, seq_lens, scale, window=None, softcap=None):
    d = q.shape[-1]
    out, row = torch.empty_like(q), 0
    for table, q_len, total in zip(tables, q_lens, seq_lens):
        slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total)])
        keys = k_cache.view(-1, HKV, d)[slots].double().repeat_interleave(HQ // HKV, dim=1)
        values = v_cache.view(-1, HKV, d)[slots].double().repeat_interleave(HQ // HKV, dim=1)
        for j in range(q_len):
            p = total - q_len + j
            first = max(0, p - window + 1) if window else 0
            scores = torch.einsum("hd,khd->hk", q[row].double(), keys[first:p + 1]) * scale
            if softcap:
                scores = torch.tanh(scores / softcap) * softcap
            out[row] = torch.einsum("hk,khd->hd", scores.softmax(-1), values[first:p + 1]).float()
            row += 1
    return out


def random_step(rng: random.Random) -> tuple[list[int], list[int]]:
    q_lens, seq_lens = [], []
    for _ in range(rng.randrange(1, 7)):
        kind = rng.choice(["decode", "fresh", "extend", "long_extend"])
        cached = 0 if kind == "fresh" else rng.randrange(1, 40)
        q_len = {"decode": 1, "fresh": rng.randrange(1, 30), "extend": rng.randrange(2, 20),
                 "long_extend": rng.randrange(65, 90)}[kind]
        q_lens.append(q_len)
        seq_lens.append(cached + q_len)
    return q_lens, seq_lens


def tensors(q_lens: list[int], d: int):
    total = sum(q_lens)
    caches = torch.randn(NUM_BLOCKS, BLOCK, HKV, d), torch.randn(NUM_BLOCKS, BLOCK, HKV, d)
    return (torch.randn(total, HQ, d), torch.randn(total, HKV, d), torch.randn(total, HKV, d)), caches


@pytest.mark.parametrize("d", [8, 64, 128, 40])
@pytest.mark.parametrize("seed", range(4))
def test_ragged_batch_matches_reference(backend, seed, d):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    q_lens, seq_lens = random_step(rng)
    meta, tables = build_batch(rng, q_lens, seq_lens)
    (q, k, v), (k_cache, v_cache) = tensors(q_lens, d)
    window, softcap = [(None, None), (7, None), (None, 2.5), (13, 4.0)][seed]
    out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.3, window, softcap)
    assert torch.equal(k_cache.view(-1, HKV, d)[meta.slot_mapping], k), "new keys must be stored at slot_mapping"
    assert torch.equal(v_cache.view(-1, HKV, d)[meta.slot_mapping], v), "new values must be stored at slot_mapping"
    expected = reference(q, k_cache, v_cache, tables, q_lens, seq_lens, 0.3, window, softcap)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_a_token_gets_the_same_bits_alone_in_a_batch_and_inside_a_prefill(backend):
    """Sequence 0's last token: as a decode alone, as a decode beside a mixed batch, and as the last row of a
    prefill of its whole sequence: the cache holds the same keys each time, so the output is bitwise the same."""
    rng = random.Random(7)
    torch.manual_seed(7)
    d, length = 64, 37
    keys, values = torch.randn(length, HKV, d), torch.randn(length, HKV, d)
    queries = torch.randn(length, HQ, d)
    outputs = []
    for q_lens, seq_lens in [([1], [length]), ([1, 5, 1, 30], [length, 20, 50, 44]), ([length], [length])]:
        meta, _ = build_batch(rng, q_lens, seq_lens)
        k_cache, v_cache = torch.zeros(NUM_BLOCKS, BLOCK, HKV, d), torch.zeros(NUM_BLOCKS, BLOCK, HKV, d)
        table = meta.block_tables[0].tolist()
        for p in range(length):  # sequence 0's earlier tokens are already cached
            k_cache[table[p // BLOCK], p % BLOCK], v_cache[table[p // BLOCK], p % BLOCK] = keys[p], values[p]
        n = sum(q_lens)
        q, k, v = torch.randn(n, HQ, d), torch.randn(n, HKV, d), torch.randn(n, HKV, d)
        first = length - q_lens[0]
        q[:q_lens[0]], k[:q_lens[0]], v[:q_lens[0]] = queries[first:], keys[first:], values[first:]
        out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.125)
        outputs.append(out[q_lens[0] - 1])
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])


def test_auto_picks_the_kernel_for_float32_on_cpu_only(tmp_path):
    assert isinstance(make_attention_backend("auto", "cpu", str(tmp_path)), CpuAttentionBackend)
    assert isinstance(make_attention_backend("auto", "cpu", str(tmp_path), torch.bfloat16), TorchAttentionBackend)
    assert isinstance(make_attention_backend("torch", "cpu", str(tmp_path)), TorchAttentionBackend)


def test_bfloat16_falls_back_to_the_torch_backend(backend):
    rng = random.Random(3)
    q_lens, seq_lens = [1, 9], [12, 20]
    meta, _ = build_batch(rng, q_lens, seq_lens)
    (q, k, v), (k_cache, v_cache) = tensors(q_lens, 64)
    args = [t.bfloat16() for t in (q, k, v)]
    caches = k_cache.bfloat16(), v_cache.bfloat16()
    expected = TorchAttentionBackend().forward(*args, *[c.clone() for c in caches], meta, 0.3)
    assert torch.equal(backend.forward(*args, *caches, meta, 0.3), expected)
