"""Our own forward passes: decoder.py runs every family; a family file states what differs from Llama.

The family is chosen from config.json's `architectures`; anything else is refused at load with one line.
"""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import torch

from ..attention.base import AttentionBackend

from ..unsupported import UnsupportedModelError
from ..layers.cpu_ops import decoder_ops
from . import gemma2, gemma3, llama, mistral, phi3, qwen2, qwen3, qwen3_moe
from .decoder import DecoderForCausalLM, Projection
from .spec import ModelSpec

if TYPE_CHECKING:
    from ..loading.checkpoint import CausalLM

FAMILIES: dict[str, ModuleType] = {
    "LlamaForCausalLM": llama, "MistralForCausalLM": mistral, "Qwen2ForCausalLM": qwen2,
    "Qwen3ForCausalLM": qwen3, "Qwen3MoeForCausalLM": qwen3_moe, "Gemma2ForCausalLM": gemma2,
    "Gemma3ForCausalLM": gemma3, "Phi3ForCausalLM": phi3,
}


# A config.json without `architectures` (written by hand, or by an older converter) names its model_type.
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "gemma2": "Gemma2ForCausalLM",
               "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM"}


def architecture(cfg) -> str:
    """The checkpoint's class name, from config.json's `architectures` or else its `model_type`."""
    names = getattr(cfg, "architectures", None)
    if names:
        return names[0]
    model_type = str(getattr(cfg, "model_type", None))
    return MODEL_TYPES.get(model_type, f"model_type {model_type!r}")


def family(cfg) -> ModuleType:
    name = architecture(cfg)
    if name not in FAMILIES:
        raise UnsupportedModelError(name)
    return FAMILIES[name]


def model_spec(cfg) -> ModelSpec:
    return family(cfg).spec(cfg, architecture(cfg))


def norm_offset(cfg) -> float:
    return getattr(family(cfg), "NORM_OFFSET", 0.0)


def build_model(hf_model: CausalLM, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                max_model_len: int, weights: dict[str, torch.Tensor],
                quant: dict[str, Projection] | None = None, cache_dir: str | None = None) -> DecoderForCausalLM:
    """The engine model of a checkpoint from its engine-layout tensors (loading/weights.py); cache_dir: where
    the CPU kernels are built."""
    spec = model_spec(hf_model.config)
    ops = decoder_ops(spec.hidden_size, spec.eps, quant is not None, device, dtype, cache_dir)
    return DecoderForCausalLM(spec, weights, attention, device, dtype, max_model_len, hf_model.config, quant, ops)


__all__ = ["FAMILIES", "DecoderForCausalLM", "ModelSpec", "build_model", "model_spec", "norm_offset"]
