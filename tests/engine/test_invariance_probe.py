"""The start-up probe finds a GEMM whose one-row path differs from its many-row path in one output of thousands
(oneDNN's bf16 GEMM on an AVX512-BF16 Xeon without AMX: about 1 in 6,700, which one 1-row call of 576 outputs
missed, so bf16 ran with row pad 1 and lost batch invariance). Few CPUs have such a path, so the test makes one:
a stand-in GEMM, exact row by row, that nudges rare outputs of 1-row calls (the fault it stands for cannot be
caused on most machines)."""
from __future__ import annotations

import torch

from batchinfer.engine.layers.linear import RowPlan, pad_rows
from batchinfer.engine.runner import invariance

RARE = 6700  # one output in this many, as measured


def _gemm(one_row_differs: bool):
    def linear(x, weight, plan):
        n, x = x.shape[0], pad_rows(x, plan.pad)
        y = torch.cat([x[i:i + 1].float() @ weight.float().T for i in range(x.shape[0])])  # each row alone: exact
        if one_row_differs and x.shape[0] == 1:
            seed = int(x.float().abs().sum().item() * 1e3) % RARE  # which outputs: a function of the row's data
            hit = (torch.arange(y.shape[1]) * 7919 + seed) % RARE == 0
            y[0, hit] *= 1 + 2 ** -6
        return y[:n].to(x.dtype)
    return linear


def test_the_probe_finds_a_one_row_path_that_differs_in_one_output_of_thousands(monkeypatch):
    weight = torch.randn(576, 1536, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    monkeypatch.setattr(invariance, "linear", _gemm(one_row_differs=False))
    assert invariance._linear_invariant(weight, RowPlan(1, 0))
    monkeypatch.setattr(invariance, "linear", _gemm(one_row_differs=True))
    assert not invariance._linear_invariant(weight, RowPlan(1, 0))
    assert invariance._linear_invariant(weight, RowPlan(4, 0))  # a pad of 4 never makes a 1-row call
