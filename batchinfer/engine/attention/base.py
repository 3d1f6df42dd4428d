"""The attention backend contract: ragged batches over the paged KV cache.

KV cache layout, per layer: k_cache and v_cache of shape [num_blocks, block_size, num_kv_heads, head_dim].
Token slot s lives at block s // block_size, offset s % block_size. A backend owns what is inside a block: the CPU
kernel keeps its keys transposed there (cpu_backend.py); only the backend that wrote a cache reads it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..layers.rope import apply_rope


@dataclass
class AttentionMetadata:
    """One step's flat ragged batch. Sequence i owns new tokens cu_seqlens_q[i]:cu_seqlens_q[i+1];
    its first seq_lens[i] - q_len(i) tokens are already in the cache (a cached prefix or earlier chunks)."""

    slot_mapping: torch.Tensor  # int64 [num_new_tokens]: cache slot each new token's K/V is written to
    cu_seqlens_q: torch.Tensor  # int32 [batch + 1]
    seq_lens: torch.Tensor  # int32 [batch]: cached + new tokens
    block_tables: torch.Tensor  # int32 [batch, max_blocks_per_seq], padded with 0
    max_seqlen_q: int
    max_seq_len: int

    @property
    def is_decode(self) -> bool:
        return self.max_seqlen_q == 1


class AttentionBackend(ABC):
    def rope(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_q_heads: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """qk [tokens, q heads + kv heads, head_dim] rotated (layers/rope.py apply_rope), as (q, k) for forward."""
        qk = apply_rope(qk, cos, sin)
        return qk[:, :num_q_heads], qk[:, num_q_heads:]

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_new_tokens, num_q_heads, head_dim]
        k: torch.Tensor,  # [num_new_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_new_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:  # [num_new_tokens, num_q_heads, head_dim]
        """Store k and v at meta.slot_mapping, then let each new token attend to its sequence's cached
        tokens and, causally, to the new tokens up to and including itself. Query head h reads KV head
        h // (num_q_heads // num_kv_heads) (GQA). With a window, the token at position p sees only keys
        p - window < j <= p; with a softcap, scores are softcap * tanh(score / softcap) before the softmax."""
