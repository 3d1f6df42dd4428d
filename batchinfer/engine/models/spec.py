"""ModelSpec: what one checkpoint's forward pass needs to know, read from its config.json.

A family file (llama.py, gemma2.py, ...) fills it in; decoder.py runs any spec. Sizes and the per-layer
attention pattern (window, RoPE table) come from the config; the family states what differs from Llama.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..layers.activation import ACTIVATIONS
from ..layers.rope import check_rope, rope_parameters
from ..unsupported import UnsupportedModelError

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    renormalize: bool  # top-k weights divided by their sum
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or a dense MLP


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    eps: float
    scale: float  # attention scores are q.k * scale
    layer_windows: tuple[int | None, ...]  # per layer: attend the last `window` tokens, or all (None)
    layer_rope: tuple[str, ...]  # per layer: the key of its RoPE table in `ropes`
    ropes: dict[str, dict] = field(hash=False)
    activation: str = "silu"
    qkv_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # norms after attention and around the MLP too (Gemma 2/3)
    embed_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    moe: MoeSpec | None = None


def base_spec(cfg, architecture: str, layer_types: Callable[[Any], list[str]] | None = None,
              **family) -> ModelSpec:
    """The Llama-shaped sizes and attention pattern of cfg, with the family's differences (`family`)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    types = getattr(cfg, "layer_types", None) or (layer_types(cfg) if layer_types else None)
    types = list(types or [FULL] * cfg.num_hidden_layers)
    window = getattr(cfg, "sliding_window", None)
    per_type = _rope_per_layer_type(cfg)
    ropes = {t: rope_parameters(cfg, t) for t in set(types)} if per_type else {"": rope_parameters(cfg)}
    for params in ropes.values():
        check_rope(params, architecture)
    activation = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")
    if activation not in ACTIVATIONS:
        raise UnsupportedModelError(architecture, f"activation {activation!r}")
    values = dict(
        architecture=architecture, num_layers=cfg.num_hidden_layers, num_q_heads=cfg.num_attention_heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads, head_dim=head_dim,
        hidden_size=cfg.hidden_size, eps=cfg.rms_norm_eps, scale=head_dim ** -0.5,
        layer_windows=tuple(window if t == SLIDING and window else None for t in types),
        layer_rope=tuple(t if per_type else "" for t in types), ropes=ropes, activation=ACTIVATIONS[activation],
        qkv_bias=bool(getattr(cfg, "attention_bias", False)))
    return ModelSpec(**(values | family))


def _rope_per_layer_type(cfg) -> bool:
    """Gemma 3: the local and global layers rotate with different tables."""
    nested = isinstance((getattr(cfg, "rope_parameters", None) or {}).get(FULL), dict)
    return nested or bool(getattr(cfg, "rope_local_base_freq", None))
