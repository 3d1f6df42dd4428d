"""Mixture-of-experts MLP: top-k routing, then each expert runs once over all the tokens routed to it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .activation import gated
from .linear import RowPlan, linear


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
    Batch-invariant: an expert's rows go through the row-padded linear (each row as in any batch), and a
    token's top_k contributions are added in expert-id order, so its result does not depend on which other
    tokens were routed beside it."""
    weights, experts = route(x, router, top_k, renormalize, plan)
    out = torch.zeros_like(x)
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)  # the (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    tokens = order // top_k
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        picked = order[start:start + count]
        rows = tokens[start:start + count]
        h = linear(gated(linear(x[rows], gate_up[expert], plan), activation), down[expert], plan)
        out.index_add_(0, rows, h * weights.flatten()[picked, None])
        start += count
    return out
