"""weight_format "q8_0": a dense checkpoint's projections and LM head quantized to Q8_0 once (ggml's reference
quantization) and run by the integer kernel, for checkpoints that come as bf16/fp16/fp32 safetensors.

Cached as one packed file beside the dense engine layout (quant/packed_file.py); the fused projections of the
engine layout (qkv_proj, gate_up_proj) are quantized as they are.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from ..loading.file_key import file_key
from ..unsupported import UnsupportedWeightFormat
from .kernel import load_kernel
from .packed import StackedWeight
from .packed_file import Source, packed_weights, quantize_q8_0

LAYOUT_VERSION = 2  # follows packed_file.VERSION
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def q8_0_weights(source: Path, cache_dir: str | Path, dense: Callable[[], dict[str, torch.Tensor]]) -> dict[str, StackedWeight]:
    """Engine projection names and "lm_head" -> Q8_0 weights; `dense` (the fp32 engine layout) is read only
    when the cache file is built."""
    path = Path(cache_dir) / "engine" / f"{source.stem}-{file_key(source, LAYOUT_VERSION)}-q8_0.packed"
    kernel = load_kernel(str(cache_dir), frozenset({"Q8_0"}))
    sources: list[Source] = []
    if not path.exists():
        weights = dense()
        for name in [n for n in weights if n.rsplit(".", 1)[-1] in PROJECTIONS] + ["lm_head"]:
            w = weights.get(name, weights["embed"]) if name == "lm_head" else weights[name]
            if w.dim() != 2 or w.shape[1] % 32:
                raise UnsupportedWeightFormat(f"weight_format q8_0: {name} is {tuple(w.shape)}, not in blocks of 32")
            sources.append(Source(name, "Q8_0", w.shape[0], w.shape[1], partial(_blocks, w)))
    return {name: StackedWeight([w]) for name, w in packed_weights(sources, kernel, path).items()}


def _blocks(weight: torch.Tensor):
    return quantize_q8_0(weight.detach().float().numpy())
