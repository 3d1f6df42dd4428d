"""Quantized weight formats (EngineConfig.weight_format), built once and cached beside the dense engine layout.

"gguf": the GGUF file's own quantized projections and LM head (Q4_1, Q8_0), repacked for quant_linear.
"q8_0": the dense projections and LM head quantized to Q8_0 at load, for any checkpoint.

The Llama GGUF stores q/k rows permuted for llama.cpp's RoPE (transformers' converter undoes it, so do we),
q/k/v and gate/up apart (the engine fuses them). Built once from the file and cached beside the dense engine
layout; every matrix is checked bit for bit against the de-quantized checkpoint before it is kept.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .file_key import file_key
from .layers.quant_linear import QuantWeight, dequantize, from_gguf_blocks, packable, quantize_q8_0
from .weights import _save

log = logging.getLogger(__name__)
LAYOUT_VERSION = 1
TYPES = {"Q4_1": "q4_1", "Q8_0": "q8_0"}  # ggml types the kernel reads
# engine name -> the GGUF tensors stacked into it (in order)
LAYER_PARTS = {"qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
               "gate_up_proj": ("ffn_gate", "ffn_up"), "down_proj": ("ffn_down",)}


class UnsupportedWeightFormat(ValueError):
    """This checkpoint cannot run in the asked weight format (the reason is the message)."""


def quant_weights(weight_format: str, source: Path, config, cache_dir: str | Path,
                  dense: Callable[[], dict[str, torch.Tensor]]) -> dict[str, QuantWeight]:
    """Engine projection names (and "lm_head") -> QuantWeight, mapped from the cache file after the first build.
    source: the GGUF file ("gguf") or the checkpoint file the dense layout came from ("q8_0"); dense: the fp32
    engine layout, read only when building."""
    from safetensors.torch import load_file

    if weight_format == "gguf" and source.suffix != ".gguf":
        raise UnsupportedWeightFormat(f"weight_format gguf needs a .gguf checkpoint, got {source.name}")
    key = file_key(source, LAYOUT_VERSION)
    path = Path(cache_dir) / "engine" / f"{source.stem}-{key}-{weight_format}.safetensors"
    if not path.exists():
        weights = build(source, config, dense()) if weight_format == "gguf" else quantized_q8_0(dense())
        try:
            _save({k: v for name, w in weights.items() for k, v in w.tensors(name).items()}, path)
        except OSError as exc:
            log.warning("could not cache the quantized weights at %s: %s", path, exc)
            return weights
    return QuantWeight.from_tensors(load_file(str(path)))


def load_quant(weight_format: str, source: Path, tree, cache_dir: str | Path,
               dense: Callable[[], dict[str, torch.Tensor]]) -> tuple[dict[str, QuantWeight] | None, str, str]:
    """(the quantized weights with the kernel attached, or None: dense; the format that runs; why). "auto" is
    "gguf" where the checkpoint is a GGUF the loader can repack and the CPU has what the kernel is built for,
    else dense. An explicit format this checkpoint or machine cannot run raises UnsupportedWeightFormat."""
    from .layers.quant_build import CPU_FLAGS, QuantKernelUnavailable, cpu_supported, kernel_isa, load_kernel

    if weight_format == "auto" and source.suffix != ".gguf":  # checked first: no kernel build for nothing
        return None, "dense", "auto: not a GGUF checkpoint"
    if weight_format == "auto" and not cpu_supported():
        return None, "dense", f"auto: the quantized kernel needs {'/'.join(CPU_FLAGS)}"
    asked = "gguf" if weight_format == "auto" else weight_format
    try:
        lib = load_kernel(str(cache_dir))
        weights = quant_weights(asked, source, tree.config, cache_dir, dense)
    except (UnsupportedWeightFormat, QuantKernelUnavailable, KeyError) as exc:
        if weight_format == "auto":
            return None, "dense", f"auto: {exc}"
        raise UnsupportedWeightFormat(str(exc)) from exc
    for w in weights.values():
        w.lib = lib
    if weight_format != "auto":
        return weights, asked, "asked"
    kinds = "/".join(sorted({w.format.upper() for w in weights.values()}))
    isa = "avx512f: the kernel's AVX-512 build" if kernel_isa() == "avx512" else " ".join(CPU_FLAGS)
    return weights, asked, f"auto: the GGUF's own {kinds} blocks, CPU has {isa}"


def build(gguf: Path, config, dense: dict[str, torch.Tensor]) -> dict[str, QuantWeight]:
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    tensors = {t.name: t for t in reader.tensors}
    arch = _field_text(reader, "general.architecture")
    if arch != "llama":
        raise UnsupportedWeightFormat(f"weight_format gguf reads Llama GGUF files, this one is {arch!r}")
    out = {}
    for i in range(config.num_hidden_layers):
        for name, parts in LAYER_PARTS.items():
            out[f"layers.{i}.{name}"] = _stacked([tensors[f"blk.{i}.{p}.weight"] for p in parts], config)
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    out["lm_head"] = _stacked([head], config)
    for name, weight in out.items():  # the repacked blocks must be the checkpoint the dense path runs
        reference = dense["lm_head" if name == "lm_head" and "lm_head" in dense else
                          "embed" if name == "lm_head" else name]
        if not torch.equal(dequantize(weight), reference.float()):
            raise UnsupportedWeightFormat(f"weight_format gguf: {name} does not match the de-quantized checkpoint")
    return out


def _stacked(parts, config) -> QuantWeight:
    kinds = {p.tensor_type.name for p in parts}
    if len(kinds) != 1 or next(iter(kinds)) not in TYPES:
        raise UnsupportedWeightFormat(f"weight_format gguf reads {'/'.join(TYPES)} blocks, {parts[0].name} is "
                                      f"{'/'.join(sorted(kinds))}")
    rows = [_unpermuted(p, config) for p in parts]
    k = int(parts[0].shape[0])  # GGUF lists dimensions innermost first
    n = sum(r.shape[0] for r in rows)
    if not packable(n, k):
        raise UnsupportedWeightFormat(f"weight_format gguf: {parts[0].name} is {n}x{k}, not in 16x32 tiles")
    return from_gguf_blocks(TYPES[next(iter(kinds))], np.concatenate(rows), n, k)


def _unpermuted(tensor, config) -> np.ndarray:
    """The raw block rows in the checkpoint's order (transformers' reverse_permute_weights on whole rows)."""
    raw = np.asarray(tensor.data).reshape(int(tensor.shape[1]), -1)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(
        tensor.name.split(".")[-2])
    if heads is None:
        return raw
    return raw.reshape(heads, raw.shape[0] // heads // 2, 2, -1).swapaxes(2, 1).reshape(raw.shape)


def quantized_q8_0(dense: dict[str, torch.Tensor]) -> dict[str, QuantWeight]:
    """The dense projections and LM head (the embedding, when tied) quantized to Q8_0."""
    names = [n for n in dense if n.rsplit(".", 1)[-1] in LAYER_PARTS] + ["lm_head"]
    out = {}
    for name in names:
        w = dense.get(name, dense["embed"]) if name == "lm_head" else dense[name]
        if w.dim() != 2 or not packable(*w.shape):
            raise UnsupportedWeightFormat(f"weight_format q8_0: {name} is {tuple(w.shape)}, not in 16x32 tiles")
        out[name] = quantize_q8_0(w)
    return out


def _field_text(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode()
