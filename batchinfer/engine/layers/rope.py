"""Rotary position embeddings: the frequency variants Llama-family checkpoints use, as cos/sin tables.

The inverse frequencies follow transformers' modeling_rope_utils (default, linear, dynamic, llama3, yarn), so
the tables equal theirs. config.json spells RoPE two ways: transformers 5's `rope_parameters` (nested by
layer type for Gemma 3) and the older `rope_theta` + `rope_scaling` (+ Gemma 3's `rope_local_base_freq`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..unsupported import UnsupportedModelError

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_parameters(cfg, layer_type: str | None = None) -> dict:
    """The RoPE parameters of one layer type (None: the whole model), in transformers 5's spelling."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    elif not params:  # an older config.json
        params = dict(getattr(cfg, "rope_scaling", None) or {})
        theta = getattr(cfg, "rope_theta", 10000.0)
        if layer_type == "sliding_attention" and getattr(cfg, "rope_local_base_freq", None):
            params, theta = {}, cfg.rope_local_base_freq  # Gemma 3: the local layers are unscaled
        params.setdefault("rope_theta", theta)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    return params


@dataclass
class RopeTable:
    cos: torch.Tensor  # [max_len, 1, head_dim]
    sin: torch.Tensor

    @classmethod
    def build(cls, params: dict, cfg, head_dim: int, max_len: int, device) -> RopeTable:
        inv_freq, attention_factor = inverse_frequencies(params, cfg, head_dim)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        return cls((emb.cos() * attention_factor).to(device)[:, None, :],
                   (emb.sin() * attention_factor).to(device)[:, None, :])


def check_rope(params: dict, architecture: str) -> None:
    if params["rope_type"] not in ROPE_TYPES:
        raise UnsupportedModelError(architecture, f"rope_type {params['rope_type']!r}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError(architecture, "partial_rotary_factor < 1")


def inverse_frequencies(params: dict, cfg, head_dim: int) -> tuple[torch.Tensor, float]:
    """inv_freq [head_dim / 2] and the factor cos/sin are multiplied by (yarn's mscale, 1 elsewhere)."""
    base = float(params["rope_theta"])
    inv_freq = _default(base, head_dim)
    if "freq_factors" in params:  # llama.cpp's per-frequency divisors (a Llama 3.x GGUF's rope_freqs tensor)
        inv_freq = inv_freq / torch.tensor(params["freq_factors"], dtype=torch.float32)
    kind = params["rope_type"]
    if kind == "linear":
        return inv_freq / params["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    if kind == "yarn":
        return _yarn(base, head_dim, params, cfg)
    # "dynamic" (NTK) rescales only past max_position_embeddings, which the engine never serves
    # (LLMEngine caps max_model_len there): within it the frequencies are the default ones.
    return inv_freq, 1.0


def _default(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(base: float, dim: int, params: dict, cfg) -> tuple[torch.Tensor, float]:
    original = params.get("original_max_position_embeddings") or cfg.max_position_embeddings
    factor = params.get("factor") or cfg.max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else _yarn_mscale(factor))
    low, high = _yarn_correction_range(params.get("beta_fast") or 32, params.get("beta_slow") or 1, dim, base,
                                       original, params.get("truncate", True))
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    ramp = (torch.arange(dim // 2, dtype=torch.float32) - low) / ((high + 0.001 if low == high else high) - low)
    extrapolation = 1 - ramp.clamp(0, 1)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_correction_range(beta_fast, beta_slow, dim: int, base: float, original: int, truncate: bool):
    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))
    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, head_dim] rotated by the (neox-style, half-split) cos/sin of each token's position."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)
