"""The gated MLP's activation: act(gate) * up, SiLU (SwiGLU) or tanh-approximated GELU (GeGLU, Gemma)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def gated(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """gate_up [n, 2 * intermediate] -> act(gate) * up [n, intermediate], in place where it can be."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate, inplace=True).mul_(up)  # in place: no temporaries
    return F.gelu(gate, approximate="tanh").mul_(up)
