"""Mistral: Llama with a sliding window on every layer (config `sliding_window`, null for none)."""
from __future__ import annotations

from .spec import SLIDING, ModelSpec, base_spec


def spec(cfg, architecture: str) -> ModelSpec:
    return base_spec(cfg, architecture, layer_types=lambda c: [SLIDING] * c.num_hidden_layers)
