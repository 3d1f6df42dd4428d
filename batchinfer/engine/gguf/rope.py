"""A GGUF's RoPE metadata as transformers 5's `rope_parameters` (what layers/rope.py builds its tables from).

llama.cpp keeps the base, and a scaling type with its factor (a factor with no type is linear, as llama.cpp reads
it); YaRN adds the original context and its betas. Llama 3's scaling comes as one divisor per frequency (the
rope_freqs tensor, what the converter computed from the llama3 parameters): layers/rope.py applies them as given.
"""
from __future__ import annotations

from typing import Any

from ..unsupported import UnsupportedGGUF
from .reader import GGUFFile

# rope.scaling.* keys of YaRN -> transformers' names
YARN_KEYS = {"original_context_length": "original_max_position_embeddings", "yarn_attn_factor": "attention_factor",
             "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow"}


def rope_parameters(g: GGUFFile) -> dict[str, Any]:
    theta = float(g.arch_value("rope.freq_base", 10000.0))
    if "rope_freqs.weight" in g.tensors:
        if g.tensors["rope_freqs.weight"].type != "F32":
            raise UnsupportedGGUF(f"{g.path.name}: tensor rope_freqs.weight is {g.tensors['rope_freqs.weight'].type}, "
                                  "not F32")
        return {"rope_type": "default", "rope_theta": theta, "freq_factors": g.array("rope_freqs.weight").tolist()}
    factor = g.arch_value("rope.scaling.factor", g.arch_value("rope.scale_linear"))
    kind = str(g.arch_value("rope.scaling.type", "linear" if factor else "none"))
    if kind == "none" or (kind == "linear" and float(factor or 1.0) == 1.0):
        return {"rope_type": "default", "rope_theta": theta}
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor), "rope_theta": theta}
    if kind == "yarn":
        extra = {name: g.arch_value(f"rope.scaling.{key}") for key, name in YARN_KEYS.items()}
        return {"rope_type": "yarn", "factor": float(factor), "rope_theta": theta} | \
            {name: value for name, value in extra.items() if value is not None}
    raise UnsupportedGGUF(f"{g.path.name}: RoPE scaling {kind!r} is not supported (default, linear, yarn)")
