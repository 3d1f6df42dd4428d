"""Which GGUF tensors make each engine weight, per architecture, and the block types the kernel reads.

Projections the engine fuses (q/k/v, gate/up) stay separate tensors in their own block types and run into one
output (quant/packed.py StackedWeight). llama.cpp stores Llama's q and k rows permuted for its RoPE; the repack
puts them back in the checkpoint's order, so the engine's RoPE and KV cache are the dense path's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..quant.kernel import TYPES
from ..unsupported import UnsupportedGGUF
from .reader import GGUFFile

FLOATS = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class Part:
    tensor: str  # the GGUF tensor
    heads: int = 0  # > 0: rows permuted for llama.cpp's RoPE, in this many heads


@dataclass(frozen=True)
class Projection:
    name: str  # the engine's name ("layers.3.qkv_proj", "lm_head")
    parts: tuple[Part, ...]


def projections(g: GGUFFile, config: dict) -> list[Projection]:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    permuted = g.architecture == "llama"
    out = []
    for i in range(config["num_hidden_layers"]):
        b = f"blk.{i}."
        out += [Projection(f"layers.{i}.qkv_proj", (Part(b + "attn_q.weight", heads if permuted else 0),
                                                    Part(b + "attn_k.weight", kv_heads if permuted else 0),
                                                    Part(b + "attn_v.weight"))),
                Projection(f"layers.{i}.o_proj", (Part(b + "attn_output.weight"),)),
                Projection(f"layers.{i}.gate_up_proj", (Part(b + "ffn_gate.weight"), Part(b + "ffn_up.weight"))),
                Projection(f"layers.{i}.down_proj", (Part(b + "ffn_down.weight"),))]
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    out.append(Projection("lm_head", (Part(head),)))
    for projection in out:
        for part in projection.parts:
            check_type(g, part.tensor)
    return out


def dense_tensors(g: GGUFFile, config: dict) -> dict[str, str]:
    """Engine name -> GGUF tensor for the small float tensors (norms)."""
    out = {"final_norm": "output_norm.weight"}
    for i in range(config["num_hidden_layers"]):
        out |= {f"layers.{i}.input_norm": f"blk.{i}.attn_norm.weight", f"layers.{i}.post_norm": f"blk.{i}.ffn_norm.weight"}
    missing = [t for t in out.values() if t not in g.tensors]
    if missing:
        raise UnsupportedGGUF(f"{g.path.name}: tensor {missing[0]} is missing")
    return out


def check_type(g: GGUFFile, name: str) -> None:
    if name not in g.tensors:
        raise UnsupportedGGUF(f"{g.path.name}: tensor {name} is missing")
    kind = g.tensors[name].type
    if kind not in TYPES and kind not in FLOATS:
        raise UnsupportedGGUF(f"{g.path.name}: tensor {name} is {kind}, a block type the engine does not read "
                              f"(it reads {', '.join((*TYPES, *FLOATS))})")


def rope_rows(n: int, heads: int) -> np.ndarray:
    """Checkpoint row r of a llama.cpp-permuted q/k matrix is file row rows[r] (transformers' reverse permute)."""
    d = n // heads
    h, t, j = np.meshgrid(np.arange(heads), np.arange(2), np.arange(d // 2), indexing="ij")
    return (h * d + 2 * j + t).reshape(-1)
