"""Mixture-of-experts MLP: top-k routing, then each expert runs once over all the tokens routed to it; its
projections dense (moe_mlp) or in GGUF blocks on the integer kernel (quant_moe_mlp)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from .activation import gated
from .linear import RowPlan, linear

Projection = Callable[[torch.Tensor], torch.Tensor]


def route(x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool,
          rows: RowPlan = RowPlan()) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts' logits (float32), the top_k of each token: weights [n, k], expert ids [n, k]."""
    probs = F.softmax(linear(x, router, rows), dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(x.dtype), experts


def moe_mlp(x: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
            renormalize: bool, activation: str, plan: RowPlan = RowPlan()) -> torch.Tensor:
    """x [n, hidden]; gate_up [experts, 2 * inter, hidden], down [experts, hidden, inter] -> [n, hidden].
    An expert's rows go through the row-padded linear (each row as in any batch)."""
    def expert(e: int, h: torch.Tensor) -> torch.Tensor:
        return linear(gated(linear(h, gate_up[e], plan), activation), down[e], plan)

    return mix(x, *route(x, router, top_k, renormalize, plan), gate_up.shape[0], expert)


def quant_moe_mlp(x: torch.Tensor, router: torch.Tensor, gate_up: Sequence[Projection], down: Sequence[Projection],
                  top_k: int, renormalize: bool, activation: str, plan: RowPlan = RowPlan()) -> torch.Tensor:
    """moe_mlp with each expert's projections quantized (quant/packed.py): rows quantized one by one, so an
    expert's output for a row never depends on the other rows routed to it."""
    def expert(e: int, h: torch.Tensor) -> torch.Tensor:
        return down[e](gated(gate_up[e](h), activation))

    return mix(x, *route(x, router, top_k, renormalize, plan), len(gate_up), expert)


def mix(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, num_experts: int,
        expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Sum of each token's top-k experts' outputs, weighted. Batch-invariant: a token's contributions are added in
    expert-id order, so its result does not depend on which other tokens were routed beside it."""
    top_k = experts.shape[1]
    out = torch.zeros_like(x)
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)  # the (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    tokens = order // top_k
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        picked = order[start:start + count]
        rows = tokens[start:start + count]
        out.index_add_(0, rows, expert(e, x[rows]) * weights.flatten()[picked, None])
        start += count
    return out
