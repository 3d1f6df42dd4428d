"""Qwen3-MoE: Qwen3 whose MLP is a top-k mixture of experts (softmax router, optional renormalisation);
`mlp_only_layers` and `decoder_sparse_step` keep some layers dense."""
from __future__ import annotations

from .qwen2 import qwen_layer_types
from .spec import ModelSpec, MoeSpec, base_spec


def spec(cfg, architecture: str) -> ModelSpec:
    experts: int = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0
    dense, step = set(getattr(cfg, "mlp_only_layers", None) or []), getattr(cfg, "decoder_sparse_step", 1) or 1
    sparse = tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(cfg.num_hidden_layers))
    moe = MoeSpec(experts, cfg.num_experts_per_tok, bool(getattr(cfg, "norm_topk_prob", False)), sparse)
    return base_spec(cfg, architecture, layer_types=qwen_layer_types, qk_norm=True, moe=moe)
