"""Cascade attention: shared-prefix grouping, the log-sum-exp merge, and the torch backend with cascade on
against the same backend gathering every sequence's whole context, on batches that share prefix blocks."""
from __future__ import annotations

import random

import pytest
import torch
from test_torch_attention import BLOCK, HKV, HQ, D, reference

from batchinfer.engine.attention.base import AttentionMetadata
from batchinfer.engine.attention.cascade import (_attention_with_lse_math, attention_with_lse,
                                                 find_shared_prefixes, merge_attention_states)
from batchinfer.engine.attention.torch_backend import TorchAttentionBackend


def test_sequences_sharing_leading_blocks_form_one_group():
    tables = [[7, 8, 9, 10, 11, 1], [7, 8, 9, 10, 11, 2], [7, 8, 9, 10, 12, 3], [5, 6, 4, 3, 2, 1]]
    groups = find_shared_prefixes(tables, cached_blocks=[6, 6, 6, 6], min_blocks=4)
    assert [(g.members, g.num_blocks) for g in groups] == [([0, 1, 2], 4)]


def test_a_short_common_prefix_is_split_by_the_blocks_below_it():
    """A one-block system prompt common to all, then two documents: one group per document."""
    doc_a, doc_b = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    tables = [[0] + doc_a + [20], [0] + doc_b + [21], [0] + doc_a + [22], [0] + doc_b + [23], [0, 30, 31]]
    groups = find_shared_prefixes(tables, cached_blocks=[7, 7, 7, 7, 3], min_blocks=4)
    assert sorted((g.members, g.num_blocks) for g in groups) == [([0, 2], 6), ([1, 3], 6)]


def test_a_prefix_is_shared_only_as_far_as_every_member_has_it_cached():
    tables = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 8]]
    groups = find_shared_prefixes(tables, cached_blocks=[6, 4], min_blocks=4)
    assert [(g.members, g.num_blocks) for g in groups] == [([0, 1], 4)]
    assert find_shared_prefixes(tables, cached_blocks=[6, 3], min_blocks=4) == []


def test_merging_two_key_halves_equals_attention_over_all_keys():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, HQ, 5, D), torch.randn(1, HKV, 40, D), torch.randn(1, HKV, 40, D)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    out_a, lse_a = attention_with_lse(q, k[:, :, :17], v[:, :, :17], None, 0.3)
    out_b, lse_b = attention_with_lse(q, k[:, :, 17:], v[:, :, 17:], None, 0.3)
    merged = merge_attention_states(out_a[0].transpose(0, 1), lse_a[0].transpose(0, 1),
                                    out_b[0].transpose(0, 1), lse_b[0].transpose(0, 1))
    torch.testing.assert_close(merged, whole[0].transpose(0, 1), atol=1e-5, rtol=1e-4)


def test_math_path_matches_the_cpu_flash_kernel_with_a_mask():
    """The path taken off CPU, checked here against the CPU kernel on the same grouped, masked input."""
    torch.manual_seed(1)
    q, k, v = torch.randn(3, HQ, 4, D), torch.randn(3, HKV, 11, D), torch.randn(3, HKV, 11, D)
    bias = torch.zeros(3, 1, 4, 11).masked_fill_(torch.rand(3, 1, 4, 11) < 0.3, float("-inf"))
    bias[..., 0] = 0
    out, lse = attention_with_lse(q, k, v, bias, 0.3)
    group = HQ // HKV
    folded_bias = bias.repeat(1, 1, group, 1)
    math_out, math_lse = _attention_with_lse_math(q.reshape(3, HKV, group * 4, D), k, v, folded_bias, 0.3)
    torch.testing.assert_close(out, math_out.reshape(out.shape), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(lse, math_lse.reshape(lse.shape), atol=1e-5, rtol=1e-4)


def shared_prefix_batch(rng: random.Random, prefix_blocks: list[int], kinds: list[tuple[int, int, int]],
                        num_blocks: int = 256):
    """kinds: (prefix group or -1, own cached tokens, new tokens) per sequence; group g's sequences start
    with the same prefix_blocks[g] cached blocks."""
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    prefixes = [[free.pop() for _ in range(n)] for n in prefix_blocks]
    tables, slots, q_lens, seq_lens = [], [], [], []
    for group, own, q_len in kinds:
        shared = prefixes[group] if group >= 0 else []
        total = len(shared) * BLOCK + own + q_len
        table = shared + [free.pop() for _ in range(-(-total // BLOCK) - len(shared))]
        tables.append(table)
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total - q_len, total)]
        q_lens.append(q_len)
        seq_lens.append(total)
    width = max(len(t) for t in tables)
    cu = [0]
    for q_len in q_lens:
        cu.append(cu[-1] + q_len)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_seqlen_q=max(q_lens), max_seq_len=max(seq_lens))
    return meta, tables, q_lens, seq_lens


@pytest.mark.parametrize("seed", range(6))
def test_cascade_equals_whole_context_gather(seed):
    """Two shared prefixes, sequences outside them, decodes, short extends and one long extend mixed."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    kinds = [(rng.choice([0, 0, 1, 1, -1]), rng.randrange(0, 30), rng.choice([1, 1, 1, rng.randrange(2, 20)]))
             for _ in range(rng.randrange(4, 10))]
    kinds += [(0, 3, 1), (0, 8, 2), (1, 0, 1), (1, 4, 1), (0, 5, 70)]  # two members each at least; a long extend
    meta, tables, q_lens, seq_lens = shared_prefix_batch(rng, [rng.randrange(4, 12), rng.randrange(5, 9)], kinds)
    k_cache, v_cache = torch.randn(256, BLOCK, HKV, D), torch.randn(256, BLOCK, HKV, D)
    q, k, v = torch.randn(sum(q_lens), HQ, D), torch.randn(sum(q_lens), HKV, D), torch.randn(sum(q_lens), HKV, D)
    cascade = TorchAttentionBackend(cascade=True)
    out = cascade.forward(q, k, v, k_cache, v_cache, meta, 0.3)
    assert len(cascade._plan.batches[0].shared) == 2, "both shared prefixes must be attended once"
    gathered = TorchAttentionBackend(cascade=False).forward(q, k, v, k_cache, v_cache, meta, 0.3)
    torch.testing.assert_close(out, gathered, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, q_lens, seq_lens, 0.3),
                               atol=1e-5, rtol=1e-4)


def test_cascade_in_bfloat16_stays_close_to_the_fp32_gather():
    rng = random.Random(7)
    torch.manual_seed(7)
    meta, tables, q_lens, seq_lens = shared_prefix_batch(rng, [23], [(0, rng.randrange(0, 30), 1) for _ in range(12)])
    k_cache, v_cache = torch.randn(256, BLOCK, HKV, D), torch.randn(256, BLOCK, HKV, D)
    q, k, v = torch.randn(12, HQ, D), torch.randn(12, HKV, D), torch.randn(12, HKV, D)
    want = TorchAttentionBackend(cascade=False).forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.3)
    bf = [x.bfloat16() for x in (q, k, v, k_cache, v_cache)]
    got = TorchAttentionBackend(cascade=True).forward(*bf, meta, 0.3)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
