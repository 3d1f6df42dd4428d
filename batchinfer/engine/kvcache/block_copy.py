"""Copy whole KV blocks, every layer's K and V: what copy on write asks of the cache (block_manager.take_copies)."""
from __future__ import annotations

import torch


def copy_blocks(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], pairs: list[tuple[int, int]]) -> None:
    """kv_caches: per layer (K, V), each [num_blocks, block_size, kv_heads, head_dim]; pairs: (src, dst) block ids."""
    if not pairs:
        return
    device = kv_caches[0][0].device
    src = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=device)
    dst = torch.tensor([d for _, d in pairs], dtype=torch.int64, device=device)
    for k, v in kv_caches:
        k.index_copy_(0, dst, k.index_select(0, src))
        v.index_copy_(0, dst, v.index_select(0, src))
