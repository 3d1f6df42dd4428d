"""Random ragged batches over a paged KV cache, for the kernel tests and benchmarks/gpu_check.py."""
from __future__ import annotations

import torch

from batchinfer.engine.attention.base import AttentionMetadata
from benchmarks.support.kernel_reference import store_kv_ref


class PagedBatch:
    """Sequence i has prefix_lens[i] tokens already cached (random K/V) and q_lens[i] new tokens whose
    K/V are not stored yet. Blocks are shuffled, spare blocks and unused slots hold random garbage,
    and block tables are padded with 0, so a kernel that reads the wrong slot gets a wrong answer."""

    def __init__(self, prefix_lens, q_lens, block_size, kv_heads, group, head_dim, dtype, device="cpu", seed=0):
        gen = torch.Generator().manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)  # noqa: E731
        seq_lens = [p + n for p, n in zip(prefix_lens, q_lens)]
        blocks_per_seq = [-(-n // block_size) for n in seq_lens]
        num_blocks = sum(blocks_per_seq) + 3
        order = torch.randperm(num_blocks, generator=gen)
        block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq, default=0) + 1, dtype=torch.int32)
        slots, used = [], 0
        for i, (prefix, seq_len, n_blocks) in enumerate(zip(prefix_lens, seq_lens, blocks_per_seq)):
            block_tables[i, :n_blocks] = order[used:used + n_blocks]
            used += n_blocks
            pos = torch.arange(prefix, seq_len)
            slots.append(block_tables[i, pos // block_size].long() * block_size + pos % block_size)
        num_tokens = sum(q_lens)
        self.q = rand(num_tokens, kv_heads * group, head_dim)
        self.k = rand(num_tokens, kv_heads, head_dim)
        self.v = rand(num_tokens, kv_heads, head_dim)
        self.k_cache = rand(num_blocks, block_size, kv_heads, head_dim)
        self.v_cache = rand(num_blocks, block_size, kv_heads, head_dim)
        cu_seqlens_q = torch.tensor([0] + list(q_lens)).cumsum(0).to(torch.int32)
        self.meta = AttentionMetadata(
            slot_mapping=torch.cat(slots).to(device),
            cu_seqlens_q=cu_seqlens_q.to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=block_tables.to(device),
            max_seqlen_q=max(q_lens),
            max_seq_len=max(seq_lens),
        )
        self.scale = head_dim ** -0.5

    def stored_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the caches with the new tokens' K/V written by the reference store."""
        k_cache, v_cache = self.k_cache.clone(), self.v_cache.clone()
        store_kv_ref(self.k, self.v, k_cache, v_cache, self.meta.slot_mapping)
        return k_cache, v_cache
