"""Llama forward pass over one flat ragged batch: fused QKV and gate/up, RoPE, RMSNorm, paged attention.

Weights come in the engine layout (engine/weights.py): mapped from its cache file, or converted from the
model here. Logits are computed only at the positions sampled.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.base import AttentionBackend, AttentionMetadata
from ..int8 import Int8Policy, Int8Weight
from ..loader import CausalLM
from ..weights import LAYER_FIELDS, engine_weights


@dataclass
class LlamaLayer:
    input_norm: torch.Tensor
    qkv_proj: torch.Tensor  # [(num_q_heads + 2 * num_kv_heads) * head_dim, hidden]
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up_proj: torch.Tensor  # [2 * intermediate, hidden]
    down_proj: torch.Tensor


class LlamaForCausalLM:
    def __init__(self, hf_model: CausalLM, attention: AttentionBackend, device: torch.device,
                 dtype: torch.dtype, max_model_len: int, weights: dict[str, torch.Tensor] | None = None,
                 int8: Int8Policy | None = None):
        cfg = hf_model.config
        self.num_layers: int = cfg.num_hidden_layers
        self.num_q_heads: int = cfg.num_attention_heads
        self.num_kv_heads: int = cfg.num_key_value_heads
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.hidden_size: int = cfg.hidden_size
        self.eps: float = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.attention = attention
        self.int8 = int8 or Int8Policy(max_rows=0, after_steps=0)
        self._load_weights(hf_model, device, dtype, weights)
        theta = _rope_theta(cfg)
        self.rope_cos, self.rope_sin = _rope_tables(theta, self.head_dim, max_model_len, device)

    def _load_weights(self, hf_model: CausalLM, device: torch.device, dtype: torch.dtype,
                      weights: dict[str, torch.Tensor] | None) -> None:
        """From engine-layout tensors (engine/weights.py) when given, else converted from the model here."""
        if weights is None:
            weights = engine_weights(hf_model, dtype)

        def take(name: str) -> torch.Tensor:  # no copy when the dtype and device already match
            return weights[name].to(device=device, dtype=dtype)

        self.embed = take("embed")
        self.final_norm = take("final_norm")
        self.lm_head = take("lm_head") if "lm_head" in weights else self.embed
        self.layers = [LlamaLayer(**{field: take(f"layers.{i}.{field}") for field in LAYER_FIELDS})
                       for i in range(self.num_layers)]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], sample_indices: torch.Tensor) -> torch.Tensor:
        """input_ids/positions: [num_tokens]; returns float32 logits [len(sample_indices), vocab]."""
        return self.forward_with_hidden(input_ids, positions, meta, kv_caches, sample_indices, sample_indices[:0])[0]

    @torch.inference_mode()
    def forward_with_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                            kv_caches: list[tuple[torch.Tensor, torch.Tensor]], sample_indices: torch.Tensor,
                            hidden_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Also the final-normed float32 hidden states of the rows hidden_indices names (embed requests).
        A step with such rows runs without int8 weights: an embedding must match the model's own."""
        hidden = F.embedding(input_ids, self.embed)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        packs = None if hidden_indices.numel() else self.int8.for_step(input_ids.shape[0], self.projection_weights)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            linear = _Linear(packs, f"layers.{i}.")
            hidden = hidden + self._attention(layer, linear, hidden, cos, sin, k_cache, v_cache, meta)
            hidden = hidden + self._mlp(layer, linear, hidden)
        rows = torch.cat([sample_indices, hidden_indices])
        normed = F.rms_norm(hidden[rows], (self.hidden_size,), self.final_norm, self.eps)
        n = sample_indices.numel()
        logits = _Linear(packs, "")(normed[:n], self.lm_head, "lm_head").float()
        return logits, normed[n:].float()

    def projection_weights(self) -> dict[str, torch.Tensor]:
        """The [out, in] matrices int8 may replace: every layer's projections and the LM head."""
        weights = {"lm_head": self.lm_head}
        for i, layer in enumerate(self.layers):
            weights |= {f"layers.{i}.{name}": getattr(layer, name) for name in PROJECTIONS}
        return weights

    def _attention(self, layer: LlamaLayer, linear, hidden, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        n, d = hidden.shape[0], self.head_dim
        x = F.rms_norm(hidden, (self.hidden_size,), layer.input_norm, self.eps)
        qkv = linear(x, layer.qkv_proj, "qkv_proj").view(n, self.num_q_heads + 2 * self.num_kv_heads, d)
        qk = _apply_rope(qkv[:, :self.num_q_heads + self.num_kv_heads], cos, sin)
        q, k = qk[:, :self.num_q_heads], qk[:, self.num_q_heads:]
        v = qkv[:, self.num_q_heads + self.num_kv_heads:]
        out = self.attention.forward(q, k, v, k_cache, v_cache, meta, self.scale)
        return linear(out.reshape(n, self.num_q_heads * d), layer.o_proj, "o_proj")

    def _mlp(self, layer: LlamaLayer, linear, hidden) -> torch.Tensor:
        x = F.rms_norm(hidden, (self.hidden_size,), layer.post_norm, self.eps)
        gate, up = linear(x, layer.gate_up_proj, "gate_up_proj").chunk(2, dim=-1)
        return linear(F.silu(gate, inplace=True).mul_(up), layer.down_proj, "down_proj")  # in place: no temporaries


PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class _Linear:
    """F.linear with the dense weight, or its int8 copy when this step uses int8 (packs is not None)."""

    __slots__ = ("packs", "prefix")

    def __init__(self, packs: dict[str, Int8Weight] | None, prefix: str):
        self.packs, self.prefix = packs, prefix

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, name: str) -> torch.Tensor:
        if self.packs is None:
            return F.linear(x, weight)
        return self.packs[self.prefix + name](x)


def _rope_theta(cfg) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise NotImplementedError(f"rope_type {params['rope_type']!r} is not supported yet")
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def _rope_tables(theta: float, head_dim: int, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(device)[:, None, :], emb.sin().to(device)[:, None, :]


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)
