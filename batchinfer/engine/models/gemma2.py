"""Gemma 2: GeGLU (tanh GELU), (1 + w) RMSNorms, norms after attention and around the MLP, embeddings
scaled by sqrt(hidden), scores scaled by query_pre_attn_scalar, attention and final logits soft-capped,
sliding-window layers alternating with global ones (even layers slide)."""
from __future__ import annotations

from .spec import FULL, SLIDING, ModelSpec, base_spec

NORM_OFFSET = 1.0


def spec(cfg, architecture: str) -> ModelSpec:
    return base_spec(cfg, architecture, layer_types=_alternating, **gemma_differences(cfg))


def gemma_differences(cfg) -> dict:
    return dict(sandwich_norms=True, embed_scale=cfg.hidden_size ** 0.5,
                scale=cfg.query_pre_attn_scalar ** -0.5,
                attn_softcap=getattr(cfg, "attn_logit_softcapping", None),
                final_softcap=getattr(cfg, "final_logit_softcapping", None))


def _alternating(cfg) -> list[str]:
    return [SLIDING if i % 2 == 0 else FULL for i in range(cfg.num_hidden_layers)]
