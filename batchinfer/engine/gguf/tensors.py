"""Which GGUF tensors make each engine weight, per layer, and the block types the kernel reads.

Projections the engine fuses (q/k/v, gate/up) stay separate tensors in their own block types and run into one
output (quant/packed.py StackedWeight); a file that fuses them already (Phi-3's attn_qkv, and ffn_up holding gate
then up) is one part. An expert is its rows of the 3-D experts tensor, packed on its own. llama.cpp stores the
`llama` architecture's q and k rows permuted for its RoPE (the other architectures use the NeoX layout, as the
checkpoint); the repack puts them back in the checkpoint's order, so the engine's RoPE and KV cache are the
dense path's. Norms, biases and the router stay float (llama.cpp never quantizes them).
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
    rope: tuple[tuple[int, int], ...] = ()  # (rows, heads) ranges from row 0 permuted for llama.cpp's RoPE
    expert: int | None = None  # one expert's matrix of a 3-D experts tensor

    @property
    def key(self) -> str:
        return self.tensor if self.expert is None else f"{self.tensor}#{self.expert}"

    def rows(self, n: int) -> np.ndarray | None:
        """Checkpoint row r is file row rows[r] (None: the file's order)."""
        if not self.rope:
            return None
        pieces, start = [], 0
        for count, heads in self.rope:
            pieces.append(start + rope_rows(count, heads))
            start += count
        return np.concatenate([*pieces, np.arange(start, n)])


@dataclass(frozen=True)
class Projection:
    name: str  # the engine's name ("layers.3.qkv_proj", "layers.3.experts.5.down_proj", "lm_head")
    parts: tuple[Part, ...]


def projections(g: GGUFFile, config: dict) -> list[Projection]:
    out = []
    for i in range(config["num_hidden_layers"]):
        b = f"blk.{i}."
        out += [Projection(f"layers.{i}.qkv_proj", _qkv(g, config, b, "weight")),
                Projection(f"layers.{i}.o_proj", (Part(b + "attn_output.weight"),)), *_mlp(g, i)]
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    out.append(Projection("lm_head", (Part(head),)))
    for projection in out:
        for part in projection.parts:
            check_type(g, part.tensor)
    return out


def _qkv(g: GGUFFile, config: dict, b: str, kind: str) -> tuple[Part, ...]:
    heads, kv_heads, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    permuted = g.architecture == "llama"
    q, k = (heads * d, heads), (kv_heads * d, kv_heads)
    if f"{b}attn_qkv.{kind}" in g.tensors:  # one fused tensor (Phi-3; llama.cpp's --fuse-qkv)
        return (Part(f"{b}attn_qkv.{kind}", (q, k) if permuted else ()),)
    return (Part(f"{b}attn_q.{kind}", (q,) if permuted else ()), Part(f"{b}attn_k.{kind}", (k,) if permuted else ()),
            Part(f"{b}attn_v.{kind}"))


def _mlp(g: GGUFFile, i: int) -> list[Projection]:
    b, name = f"blk.{i}.", f"layers.{i}."
    if b + "ffn_gate_inp.weight" in g.tensors:
        return [p for e in range(g.tensors[b + "ffn_down_exps.weight"].shape[0]) for p in _expert(g, b, f"{name}experts.{e}.", e)]
    gate_up = (Part(b + "ffn_gate.weight"), Part(b + "ffn_up.weight")) if b + "ffn_gate.weight" in g.tensors else \
        (Part(b + "ffn_up.weight"),)  # Phi-3: gate then up in one tensor, the engine's gate_up_proj layout
    return [Projection(name + "gate_up_proj", gate_up), Projection(name + "down_proj", (Part(b + "ffn_down.weight"),))]


def _expert(g: GGUFFile, b: str, name: str, e: int) -> list[Projection]:
    if b + "ffn_gate_up_exps.weight" in g.tensors:  # llama.cpp's --fuse-gate-up-exps: gate then up already
        gate_up: tuple[Part, ...] = (Part(b + "ffn_gate_up_exps.weight", expert=e),)
    else:
        gate_up = (Part(b + "ffn_gate_exps.weight", expert=e), Part(b + "ffn_up_exps.weight", expert=e))
    return [Projection(name + "gate_up_proj", gate_up), Projection(name + "down_proj", (Part(b + "ffn_down_exps.weight", expert=e),))]


# engine name (after "layers.{i}.") -> the GGUF tensor, where the file has it
OPTIONAL = {"attn_out_norm": "post_attention_norm.weight", "mlp_out_norm": "post_ffw_norm.weight",
            "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight", "router": "ffn_gate_inp.weight"}


def dense_tensors(g: GGUFFile, config: dict) -> dict[str, tuple[Part, ...]]:
    """Engine name -> the float GGUF tensors it concatenates: norms (Gemma's already 1 + w in the file, as the
    engine keeps them), q/k/v biases, routers."""
    out: dict[str, tuple[Part, ...]] = {"final_norm": (Part("output_norm.weight"),)}
    for i in range(config["num_hidden_layers"]):
        b, name = f"blk.{i}.", f"layers.{i}."
        out |= {name + "input_norm": (Part(b + "attn_norm.weight"),), name + "post_norm": (Part(b + "ffn_norm.weight"),)}
        out |= {name + key: (Part(b + tensor),) for key, tensor in OPTIONAL.items() if b + tensor in g.tensors}
        if b + "attn_qkv.bias" in g.tensors or b + "attn_q.bias" in g.tensors:
            out[name + "qkv_bias"] = _qkv(g, config, b, "bias")
    for parts in out.values():
        for part in parts:
            check_type(g, part.tensor, FLOATS)
    return out


def check_type(g: GGUFFile, name: str, types: tuple[str, ...] = (*TYPES, *FLOATS)) -> None:
    if name not in g.tensors:
        raise UnsupportedGGUF(f"{g.path.name}: tensor {name} is missing")
    kind = g.tensors[name].type
    if kind not in types:
        raise UnsupportedGGUF(f"{g.path.name}: tensor {name} is {kind}, a block type the engine does not read "
                              f"(it reads {', '.join(types)} there)")


def rope_rows(n: int, heads: int) -> np.ndarray:
    """Checkpoint row r of a llama.cpp-permuted q/k matrix is file row rows[r] (transformers' reverse permute)."""
    d = n // heads
    h, t, j = np.meshgrid(np.arange(heads), np.arange(2), np.arange(d // 2), indexing="ij")
    return (h * d + 2 * j + t).reshape(-1)
