"""The engine's weight layout (fused QKV and gate/up, in the engine dtype), cached on disk once per dtype.

Converting the fp32 checkpoint at every start costs seconds and holds fp32 and bf16 copies at once. The
first load writes the engine layout as a safetensors file; later loads map it: no copy, no conversion,
and only the pages the model reads count in RSS.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .file_key import file_key
from ..models import model_spec, norm_offset
from ..models.weight_names import attention_weights, expert_weights, mlp_weights, norm

if TYPE_CHECKING:
    from .checkpoint import CausalLM

log = logging.getLogger(__name__)
LAYOUT_VERSION = 1  # bump when the layout changes: old cache files are then ignored


def engine_weights(hf_model: CausalLM, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Flat engine names -> contiguous tensors in `dtype`, from a transformers model or the light tree.
    A tied LM head is left out (the engine reuses the embedding). Raises UnsupportedModelError for a
    checkpoint no family runs."""
    spec, offset = model_spec(hf_model.config), norm_offset(hf_model.config)

    def take(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(dtype).contiguous()

    inner = hf_model.model
    weights = {"embed": take(inner.embed_tokens.weight), "final_norm": take(norm(inner.norm.weight, offset))}
    if hf_model.lm_head.weight is not inner.embed_tokens.weight:
        weights["lm_head"] = take(hf_model.lm_head.weight)
    for i, layer in enumerate(inner.layers):
        weights |= {f"layers.{i}.{name}": take(t) for name, t in _layer_weights(layer, i, spec, offset).items()}
    return weights


def _layer_weights(layer, i: int, spec, offset: float) -> dict[str, torch.Tensor]:
    out = {"input_norm": norm(layer.input_layernorm.weight, offset)} | attention_weights(layer.self_attn, offset)
    if spec.sandwich_norms:
        out |= {"attn_out_norm": norm(layer.post_attention_layernorm.weight, offset),
                "post_norm": norm(layer.pre_feedforward_layernorm.weight, offset),
                "mlp_out_norm": norm(layer.post_feedforward_layernorm.weight, offset)}
    else:
        out["post_norm"] = norm(layer.post_attention_layernorm.weight, offset)
    if spec.moe is not None and spec.moe.sparse_layers[i]:
        return out | expert_weights(layer.mlp, spec.moe.num_experts)
    return out | mlp_weights(layer.mlp)


def cached_engine_weights(folder: Path, hf_model: CausalLM, cache_dir: str | Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The engine layout mapped from its cache file; built from `hf_model` (and saved) the first time."""
    from safetensors.torch import load_file  # lazy: safetensors' torch side

    path = cache_path(folder, cache_dir, dtype)
    if path.exists():
        return load_file(str(path))  # safetensors maps the file: tensors are views of the page cache
    weights = engine_weights(hf_model, dtype)
    try:
        _save(weights, path)
    except OSError as exc:  # a read-only cache still runs, it only converts again next time
        log.warning("could not cache the engine weights at %s: %s", path, exc)
        return weights
    del weights
    return load_file(str(path))


def cache_path(folder: Path, cache_dir: str | Path, dtype: torch.dtype) -> Path:
    """One file per (checkpoint, dtype, layout); the checkpoint is named by its path, size and mtime (of its
    shard index when sharded)."""
    source = folder / "model.safetensors"
    if not source.exists():
        source = folder / "model.safetensors.index.json"
    dtype_name = str(dtype).removeprefix("torch.")
    return Path(cache_dir) / "engine" / f"{folder.name}-{file_key(source, LAYOUT_VERSION)}-{dtype_name}.safetensors"


def _save(weights: dict[str, torch.Tensor], path: Path) -> None:
    """Write beside the target and rename: a concurrent reader sees the whole file or none."""
    from safetensors.torch import save_file  # lazy: safetensors' torch side

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        save_file(weights, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
