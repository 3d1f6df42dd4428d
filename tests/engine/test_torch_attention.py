"""The torch attention backend against a naive per-token reference on random ragged paged batches."""
from __future__ import annotations

import random

import pytest
import torch

from batchinfer.engine.attention.base import AttentionMetadata
from batchinfer.engine.attention.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.fast

BLOCK, HQ, HKV, D = 4, 6, 2, 8


def build_batch(rng: random.Random, q_lens: list[int], seq_lens: list[int], num_blocks: int = 64,
                shared_blocks: int = 0):
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    shared = [free.pop() for _ in range(shared_blocks)]
    tables, slots = [], []
    for q_len, total in zip(q_lens, seq_lens):
        table = shared + [free.pop() for _ in range(-(-total // BLOCK) - shared_blocks)]
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


def reference(q, k_cache, v_cache, tables, q_lens, seq_lens, scale):
    out, row = torch.empty_like(q), 0
    for table, q_len, total in zip(tables, q_lens, seq_lens):
        slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total)])
        keys = k_cache.view(-1, HKV, D)[slots].repeat_interleave(HQ // HKV, dim=1)
        values = v_cache.view(-1, HKV, D)[slots].repeat_interleave(HQ // HKV, dim=1)
        for j in range(q_len):
            visible = total - q_len + j + 1
            scores = torch.einsum("hd,khd->hk", q[row], keys[:visible]) * scale
            out[row] = torch.einsum("hk,khd->hd", scores.softmax(-1), values[:visible])
            row += 1
    return out


@pytest.mark.parametrize("seed", range(6))
def test_ragged_batch_matches_reference(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    n = rng.randrange(1, 7)
    kinds = [rng.choice(["decode", "fresh", "extend", "long_extend"]) for _ in range(n)]
    q_lens, seq_lens = [], []
    for kind in kinds:
        cached = 0 if kind == "fresh" else rng.randrange(1, 40)
        q_len = {"decode": 1, "fresh": rng.randrange(1, 30), "extend": rng.randrange(2, 20),
                 "long_extend": rng.randrange(65, 90)}[kind]
        q_lens.append(q_len)
        seq_lens.append(cached + q_len)
    meta, tables = build_batch(rng, q_lens, seq_lens)
    check_against_reference(meta, tables, q_lens, seq_lens, 64)


def check_against_reference(meta, tables, q_lens, seq_lens, num_blocks):
    k_cache, v_cache = torch.randn(num_blocks, BLOCK, HKV, D), torch.randn(num_blocks, BLOCK, HKV, D)
    total = sum(q_lens)
    q, k, v = torch.randn(total, HQ, D), torch.randn(total, HKV, D), torch.randn(total, HKV, D)
    out = TorchAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, 0.3)
    assert torch.equal(k_cache.view(-1, HKV, D)[meta.slot_mapping], k), "new keys must be stored at slot_mapping"
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, q_lens, seq_lens, 0.3), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_batch_sharing_a_cached_prefix_matches_reference(seed):
    """Decodes and short extends whose block tables start with the same cached blocks."""
    rng = random.Random(100 + seed)
    torch.manual_seed(seed)
    shared_blocks = rng.randrange(9, 14)
    n = rng.randrange(2, 7)
    q_lens = [rng.choice([1, 1, rng.randrange(2, 20)]) for _ in range(n)]
    seq_lens = [shared_blocks * BLOCK + rng.randrange(0, 30) + q for q in q_lens]
    meta, tables = build_batch(rng, q_lens, seq_lens, num_blocks=160, shared_blocks=shared_blocks)
    check_against_reference(meta, tables, q_lens, seq_lens, 160)
