"""Qwen3: Llama with an RMSNorm over each head's q and k before RoPE, and an explicit head_dim."""
from __future__ import annotations

from .qwen2 import qwen_layer_types
from .spec import ModelSpec, base_spec


def spec(cfg, architecture: str) -> ModelSpec:
    return base_spec(cfg, architecture, layer_types=qwen_layer_types, qk_norm=True)
