"""Weight-only int8 for small steps: the projections and the LM head as int8 with one scale per output
channel, multiplied by `torch._weight_int8pack_mm` (bf16 activations).

A step of a few rows is bound by reading the weights; int8 reads half the bytes of bf16. From about 8
rows up oneDNN's bf16 matmul wins again (docs/benchmarks.md, "Weight-only int8"), and with fp32
activations the int8 kernel is 10-30x slower, so it is on only for bf16 on CPU. The int8 copies are
made once the engine has run `after_steps` small steps: a short tail of a batch never pays for them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Measured crossover on an AVX-512-BF16 EPYC (no AMX): int8 1.3-1.6x faster per decode step at 1-4 rows,
# 0.8x at 8 rows.
DEFAULT_MAX_ROWS = 4
DEFAULT_AFTER_STEPS = 16


@dataclass
class Int8Weight:
    qweight: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # [out], the activation dtype

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Weight:
        """Symmetric per output channel: weight ~= qweight * scales[:, None]."""
        w = weight.float()
        scales = w.abs().amax(dim=1).clamp_min(1e-12) / 127
        return cls(torch.round(w / scales[:, None]).to(torch.int8), scales.to(weight.dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.qweight, self.scales)


def auto_max_rows(device: str, dtype: torch.dtype) -> int:
    """int8_max_rows "auto": where the int8 kernel measured faster (bf16 on CPU), else off (0)."""
    return DEFAULT_MAX_ROWS if torch.device(device).type == "cpu" and dtype == torch.bfloat16 else 0


class Int8Policy:
    """Decides per step whether the int8 weights serve it, and makes them when small steps prove common."""

    def __init__(self, max_rows: int, after_steps: int):
        self.max_rows, self.after_steps = max_rows, after_steps
        self.small_steps = 0
        self.weights: dict[str, Int8Weight] | None = None

    def for_step(self, rows: int, dense: Callable[[], dict[str, torch.Tensor]]) -> dict[str, Int8Weight] | None:
        """The int8 weights to use for a step of `rows` tokens, or None for the dense ones. dense: the
        weights to quantize (name -> [out, in] tensor), called only the first time int8 is needed."""
        if rows > self.max_rows:
            return None
        self.small_steps += 1
        if self.weights is None and self.small_steps > self.after_steps:
            self.weights = {name: Int8Weight.quantize(w) for name, w in dense().items()}
        return self.weights
