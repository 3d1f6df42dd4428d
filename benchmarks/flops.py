"""Useful FLOPs per phase, from the model shape, to compare achieved GFLOP/s with the CPU's peak.

FLOPs = 2 * P * t (every matmul weight is used once per computed token, a multiply and an add)
      + 2 * V * H per token whose logits are computed (the tied LM head: last prompt token, each decode token)
      + 4 * L * Hq * D * c per token attending over c positions (Q.K^T and P.V)
with P the non-embedding parameters in linear layers, L layers, Hq query heads of size D, H hidden size, V vocab.
Prompt tokens taken from a prefix cache are not computed and not counted; neither is padding.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_hf_config(cls, config) -> "ModelShape":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.intermediate_size, config.vocab_size)

    @property
    def linear_params(self) -> int:
        """Weights of the q, k, v, o, gate, up and down projections over all layers."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (q_o + k_v + mlp)

    def attention_flops(self, context_sum: int) -> int:
        return 4 * self.layers * self.heads * self.head_dim * context_sum

    def prefill_flops(self, prompt_tokens: int, cached_tokens: int = 0) -> int:
        """Compute positions cached..prompt-1, each attending causally, and one LM head row."""
        computed = prompt_tokens - cached_tokens
        context_sum = sum(range(cached_tokens + 1, prompt_tokens + 1))
        return 2 * self.linear_params * computed + self.attention_flops(context_sum) + 2 * self.vocab * self.hidden

    def decode_flops(self, prompt_tokens: int, output_tokens: int) -> int:
        """The first output token comes from prefill; each later one feeds the previous token back."""
        steps = max(output_tokens - 1, 0)
        context_sum = sum(prompt_tokens + j + 1 for j in range(steps))
        per_token = 2 * self.linear_params + 2 * self.vocab * self.hidden
        return per_token * steps + self.attention_flops(context_sum)
