"""A peft adapter fused to the engine's projections: q/k/v deltas into one qkv_proj delta, gate/up into gate_up_proj.

A fused target keeps one A (the pieces' A stacked, [r_total, in]) and one block-diagonal B ([out, r_total], zero
where a piece is absent), so its delta is two matmuls whatever subset of q/k/v the adapter trained, and a piece it
did not train gets an exact zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..layers.linear import RowPlan
from ..models.spec import ModelSpec
from .peft_files import AdapterError, PeftAdapter, read_peft_adapter
from .request import LoRARequest

# peft's module name -> (the engine projection it adds to, its piece of a fused projection or None for the whole)
TARGETS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2), "qkv_proj": ("qkv_proj", None),
           "o_proj": ("o_proj", None), "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
           "gate_up_proj": ("gate_up_proj", None), "down_proj": ("down_proj", None)}
MLP_TARGETS = ("gate_up_proj", "down_proj")


@dataclass(frozen=True)
class BaseShapes:
    """Each engine projection's output pieces and input width, as the base model has them."""
    spec: ModelSpec
    intermediate_size: int

    def of(self, target: str) -> tuple[list[int], int]:
        s = self.spec
        q, kv = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        return {"qkv_proj": ([q, kv, kv], s.hidden_size), "o_proj": ([s.hidden_size], q),
                "gate_up_proj": ([self.intermediate_size] * 2, s.hidden_size),
                "down_proj": ([s.hidden_size], self.intermediate_size)}[target]


@dataclass(frozen=True)
class LoRAAdapter:
    request: LoRARequest
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, engine projection) -> (A, B), float32
    plan: RowPlan = RowPlan()  # how its matmuls cut rows to stay batch-invariant (probed on its own shapes)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def load_adapter(request: LoRARequest, base: BaseShapes, device: torch.device) -> LoRAAdapter:
    """The adapter of request.lora_path on this base; AdapterError (one line) when it does not fit."""
    name = request.lora_name
    if not Path(request.lora_path).is_dir():
        raise AdapterError(f"adapter {name!r}: {request.lora_path} is not a folder")
    peft = read_peft_adapter(request.lora_path, name)
    weights = {where: (a.to(device), b.to(device)) for where, (a, b) in _fuse(peft, base, name).items()}
    return LoRAAdapter(request, peft.scaling, weights)


def _fuse(peft: PeftAdapter, base: BaseShapes, name: str) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    pieces: dict[tuple[int, str], list[tuple[int | None, torch.Tensor, torch.Tensor]]] = {}
    for (layer, module), (a, b) in sorted(peft.modules.items()):
        target, piece = _target(layer, module, base.spec, name)
        pieces.setdefault((layer, target), []).append((piece, a, b))
    return {(layer, target): _fused(found, *base.of(target), f"adapter {name!r}: layers.{layer}.{target}")
            for (layer, target), found in pieces.items()}


def _target(layer: int, module: str, spec: ModelSpec, name: str) -> tuple[str, int | None]:
    if module not in TARGETS:
        raise AdapterError(f"adapter {name!r}: layers.{layer}.{module} is not a projection the engine adapts "
                           f"({', '.join(TARGETS)})")
    if layer >= spec.num_layers:
        raise AdapterError(f"adapter {name!r}: layers.{layer}.{module} but the base has {spec.num_layers} layers")
    target, piece = TARGETS[module]
    if target in MLP_TARGETS and spec.moe is not None and spec.moe.sparse_layers[layer]:
        raise AdapterError(f"adapter {name!r}: layers.{layer}.{module} adapts an experts layer (not supported)")
    return target, piece


def _fused(found: list[tuple[int | None, torch.Tensor, torch.Tensor]], outs: list[int], width: int,
           where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(A stacked, B block-diagonal) of one engine projection's pieces, each checked against the base's shape."""
    starts = [sum(outs[:i]) for i in range(len(outs))]
    ranks = [a.shape[0] for _, a, _ in found]
    big_b = torch.zeros(sum(outs), sum(ranks))
    col = 0
    for (piece, a, b), r in zip(found, ranks):
        row, out = (0, sum(outs)) if piece is None else (starts[piece], outs[piece])
        if a.shape[1] != width or b.shape != (out, r):
            raise AdapterError(f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit the base "
                               f"(it takes {width} inputs to {out} outputs): an adapter of another model?")
        big_b[row:row + out, col:col + r] = b
        col += r
    if len(found) > 1 and any(piece is None for piece, _, _ in found):
        raise AdapterError(f"{where}: the adapter has the fused projection and its pieces both")
    return torch.cat([a for _, a, _ in found]).contiguous(), big_b
