"""The Triton attention backend: the store and extend kernels over the paged KV cache."""
from __future__ import annotations

import torch

from batchinfer.engine.attention.base import AttentionBackend, AttentionMetadata
from batchinfer.engine.kernels import extend_attention, store_kv


class TritonAttentionBackend(AttentionBackend):
    """Stores the new K/V first, then runs the extend kernel for every step, decodes included: one kernel and
    one tiling of the keys for every token, so a token's output does not depend on its neighbours, on what was
    cached or on whether it was decoded or recomputed (issue 20; the CPU path's chunked.py makes the same
    choice). A split-K decode kernel would read long contexts with more programs, but in another order of
    reduction. Stateless: one instance serves all layers."""

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        store_kv.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return extend_attention.extend_attention(
            q, k_cache, v_cache, meta.cu_seqlens_q, meta.seq_lens, meta.block_tables, meta.max_seqlen_q, scale,
            window=window, softcap=softcap)
