"""Gemma 3 (text): Gemma 2 plus q/k RMSNorms, five local layers to one global by default, and a local RoPE
base (`rope_parameters.sliding_attention`, or `rope_local_base_freq` in older configs)."""
from __future__ import annotations

from .gemma2 import NORM_OFFSET, gemma_differences
from ..unsupported import UnsupportedModelError
from .spec import FULL, SLIDING, ModelSpec, base_spec

__all__ = ["NORM_OFFSET", "spec"]


def spec(cfg, architecture: str) -> ModelSpec:
    if getattr(cfg, "use_bidirectional_attention", False):  # the embedding variant: not a causal LM
        raise UnsupportedModelError(architecture, "use_bidirectional_attention")
    return base_spec(cfg, architecture, layer_types=_pattern, qk_norm=True, **gemma_differences(cfg))


def _pattern(cfg) -> list[str]:
    every: int = getattr(cfg, "sliding_window_pattern", None) or getattr(cfg, "_sliding_window_pattern", None) or 6
    return [SLIDING if (i + 1) % every else FULL for i in range(cfg.num_hidden_layers)]
