"""The adapters an engine holds: loaded at first use, least recently used evicted past max_loras.

The scheduler keeps at most max_loras distinct adapters running at once, so every adapter a step needs fits and
the memory held is at most max_loras adapters (LoRAAdapter.nbytes each).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import replace

import torch

from ..layers.linear import RowPlan
from .adapter import BaseShapes, LoRAAdapter, load_adapter
from .peft_files import AdapterError
from .request import LoRARequest


class LoRAManager:
    def __init__(self, base: BaseShapes, max_loras: int, device: torch.device,
                 probe: Callable[[list[torch.Tensor]], RowPlan] | None = None):
        self.base, self.max_loras, self.device = base, max_loras, device
        self.probe = probe or self.no_probe  # an adapter's row plan from its A and B (runner/invariance.py on CPU)
        self.loaded: OrderedDict[int, LoRAAdapter] = OrderedDict()  # by lora_int_id, least recently used first
        self.num_loads = 0

    def get(self, request: LoRARequest, in_use: Collection[int] = ()) -> LoRAAdapter:
        """The adapter, loaded now if it is not held; evicts the least recently used ones not in `in_use`."""
        adapter = self.loaded.get(request.lora_int_id)
        if adapter is not None and adapter.request != request:
            raise AdapterError(f"adapter {request.lora_name!r}: lora_int_id {request.lora_int_id} is already "
                               f"{adapter.request.lora_name!r}")
        if adapter is None:
            adapter = load_adapter(request, self.base, self.device)
            adapter = replace(adapter, plan=self.probe([w for pair in adapter.weights.values() for w in pair]))
            self.num_loads += 1
            self.loaded[request.lora_int_id] = adapter
        self.loaded.move_to_end(request.lora_int_id)
        self._evict(set(in_use) | {request.lora_int_id})
        return adapter

    def _evict(self, keep: set[int]) -> None:
        for key in [k for k in self.loaded if k not in keep][:max(0, len(self.loaded) - self.max_loras)]:
            del self.loaded[key]

    @staticmethod
    def no_probe(weights: list[torch.Tensor]) -> RowPlan:
        return RowPlan()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.loaded.values())
