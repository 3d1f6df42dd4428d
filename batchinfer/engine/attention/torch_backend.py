"""Attention in plain torch over the paged KV cache, batch-invariant (chunked.py).

Each step is planned once per window (gather indices, masks) and the plan serves every layer. Every
query, whether a decode, a fresh prefill or an extend over a cached prefix, reads its keys from the cache
in the same fixed chunks: one path, so a token's output does not depend on which of those it was.
"""
from __future__ import annotations

import torch

from .base import AttentionBackend, AttentionMetadata
from .chunked import ChunkBatch, chunked_attention, make_chunk_plan


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, row_pad: int = 4):
        self.row_pad = row_pad  # matmul rows padded to a multiple of this (invariance.probe_row_pad)
        self._plan_for: AttentionMetadata | None = None
        self._plans: dict[int | None, list[ChunkBatch]] = {}  # by window, for self._plan_for

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        k_flat = k_cache.view(-1, *k_cache.shape[2:])
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        k_flat.index_copy_(0, meta.slot_mapping, k)
        v_flat.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        for batch in self._get_plan(meta, k_cache.shape[1], window, q.shape[1] // k.shape[1], k.shape[1]):
            chunked_attention(q, k_flat, v_flat, batch, scale, softcap, out)
        return out

    def _get_plan(self, meta: AttentionMetadata, block_size: int, window: int | None, group: int,
                  kv_heads: int) -> list[ChunkBatch]:
        if self._plan_for is not meta:
            self._plan_for, self._plans = meta, {}
        if window not in self._plans:
            self._plans[window] = make_chunk_plan(meta, block_size, window, group, kv_heads, self.row_pad)
        return self._plans[window]
