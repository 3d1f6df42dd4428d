"""One step's adapters: which rows run which adapter, and each adapted projection's delta added to those rows.

Rows are grouped by adapter (not gathered per row, as Punica's BGMV does on a GPU): on CPU a group's two matmuls
over its rows beat a batched matmul over per-row copies of A and B (docs/adapters.md has the figures). Each
group's matmuls go through the batch-invariant linear, cut by the row plan probed on the adapter's own shapes (a
rank-2 A needed a pad of 16 where the base's shapes need 4), so a row's delta does not depend on its group's size,
and rows of no adapter are never touched: their values stay the base's, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.linear import linear
from .adapter import LoRAAdapter


@dataclass(frozen=True)
class LoRABatch:
    groups: list[tuple[LoRAAdapter, torch.Tensor]]  # each adapter of the step and its rows (int64 indices)

    @classmethod
    def of_rows(cls, row_adapters: list[LoRAAdapter | None], device: torch.device) -> LoRABatch | None:
        """From each row's adapter (None: the base); None when no row has one."""
        rows: dict[int, list[int]] = {}
        adapters: dict[int, LoRAAdapter] = {}
        for i, adapter in enumerate(row_adapters):
            if adapter is not None:
                key = adapter.request.lora_int_id
                rows.setdefault(key, []).append(i)
                adapters[key] = adapter
        if not rows:
            return None
        return cls([(adapters[k], torch.tensor(r, dtype=torch.int64, device=device)) for k, r in rows.items()])

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, target: str) -> torch.Tensor:
        """y (the base projection of x) plus each row's scaling * B(A(x)), computed in float32."""
        for adapter, rows in self.groups:
            pair = adapter.weights.get((layer, target))
            if pair is None:
                continue
            a, b, plan = *pair, adapter.plan
            delta = linear(linear(x.index_select(0, rows).float(), a, plan), b, plan) * adapter.scaling
            y.index_add_(0, rows, delta.to(y.dtype))  # y is this projection's fresh output: nobody else holds it
        return y
