"""Phi-3: Llama with q, k, v fused in one qkv_proj and gate/up in one gate_up_proj in the checkpoint
(weight_names.py reads both); a `sliding_window` applies to every layer when set."""
from __future__ import annotations

from .mistral import spec

__all__ = ["spec"]
