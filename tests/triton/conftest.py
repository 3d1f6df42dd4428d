"""Triton kernel tests. Without CUDA they run under the Triton interpreter on CPU.

triton.jit picks interpreter or compiler when a kernel is decorated, i.e. when its module is
imported, so TRITON_INTERPRET must be set before the kernel modules load; if an earlier test module
already imported them (as compiled kernels, useless on CPU), they are reloaded here.
"""
from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_MODULES = ("store_kv", "extend_attention", "decode_attention")

if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
    for _name in KERNEL_MODULES:
        _module = sys.modules.get(f"batchinfer.engine.kernels.{_name}")
        if _module is not None:
            importlib.reload(_module)

from batchinfer.engine.attention.base import AttentionMetadata  # noqa: E402
from batchinfer.engine.kernels.reference import store_kv_ref  # noqa: E402


class PagedBatch:
    """A random ragged batch over a paged cache: sequence i has prefix_lens[i] tokens already cached
    (random K/V) and q_lens[i] new tokens whose K/V are not stored yet. Blocks are shuffled, spare
    blocks and unused slots hold garbage, and block tables are padded with 0."""

    def __init__(self, prefix_lens, q_lens, block_size, kv_heads, group, head_dim, dtype, seed=0):
        gen = torch.Generator().manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)  # noqa: E731
        seq_lens = [p + n for p, n in zip(prefix_lens, q_lens)]
        blocks_per_seq = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + 3
        order = torch.randperm(num_blocks, generator=gen).tolist()
        block_tables = torch.zeros(len(seq_lens), max(max(blocks_per_seq), 1) + 1, dtype=torch.int32)
        slots = []
        for i, (prefix, seq_len, n_blocks) in enumerate(zip(prefix_lens, seq_lens, blocks_per_seq)):
            block_tables[i, :n_blocks] = torch.tensor(order[:n_blocks], dtype=torch.int32)
            order = order[n_blocks:]
            slots += [int(block_tables[i, p // block_size]) * block_size + p % block_size for p in range(prefix, seq_len)]
        num_tokens = sum(q_lens)
        self.q = rand(num_tokens, kv_heads * group, head_dim)
        self.k = rand(num_tokens, kv_heads, head_dim)
        self.v = rand(num_tokens, kv_heads, head_dim)
        self.k_cache = rand(num_blocks, block_size, kv_heads, head_dim)
        self.v_cache = rand(num_blocks, block_size, kv_heads, head_dim)
        cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        self.meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
            cu_seqlens_q=cu.to(DEVICE),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
            block_tables=block_tables.to(DEVICE),
            max_seqlen_q=max(q_lens),
            max_seq_len=max(seq_lens),
        )
        self.scale = head_dim ** -0.5

    def stored_caches(self):
        """Copies of the caches with the new tokens' K/V written by the reference store."""
        k_cache, v_cache = self.k_cache.clone(), self.v_cache.clone()
        store_kv_ref(self.k, self.v, k_cache, v_cache, self.meta.slot_mapping)
        return k_cache, v_cache


TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=1e-2),
             torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture
def paged_batch():
    """The PagedBatch class (a fixture, so test modules need not import this conftest)."""
    return PagedBatch


@pytest.fixture
def tolerance():
    """assert_close keyword arguments for a dtype."""
    return TOLERANCE.__getitem__
