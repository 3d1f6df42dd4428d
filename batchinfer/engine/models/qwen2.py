"""Qwen2 / Qwen2.5: Llama with a bias on q, k and v; layers from `max_window_layers` on may slide."""
from __future__ import annotations

from .spec import FULL, SLIDING, ModelSpec, base_spec


def spec(cfg, architecture: str) -> ModelSpec:
    return base_spec(cfg, architecture, layer_types=qwen_layer_types, qkv_bias=True)


def qwen_layer_types(cfg) -> list[str]:
    """An older config.json without `layer_types`: what transformers derives from use_sliding_window."""
    slide = getattr(cfg, "use_sliding_window", False)
    first = getattr(cfg, "max_window_layers", cfg.num_hidden_layers)
    return [SLIDING if slide and i >= first else FULL for i in range(cfg.num_hidden_layers)]
