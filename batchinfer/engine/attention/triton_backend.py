"""The Triton attention backend: the store, extend and decode kernels over the paged KV cache."""
from __future__ import annotations

import torch

from batchinfer.engine.attention.base import AttentionBackend, AttentionMetadata
from batchinfer.engine.kernels import decode_attention, extend_attention, store_kv


class TritonAttentionBackend(AttentionBackend):
    """Stores the new K/V first, then runs the decode kernel when every sequence brings one token
    (meta.max_seqlen_q == 1) and the extend kernel otherwise. Stateless: one instance serves all layers."""

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        store_kv.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.is_decode:
            return decode_attention.decode_attention(
                q, k_cache, v_cache, meta.seq_lens, meta.block_tables, meta.max_seq_len, scale,
                window=window, softcap=softcap)
        return extend_attention.extend_attention(
            q, k, v, k_cache, v_cache, meta.cu_seqlens_q, meta.seq_lens, meta.block_tables,
            meta.max_seqlen_q, scale, window=window, softcap=softcap)
