"""The one dense linear every projection, expert and LM head goes through, made batch-invariant.

A GEMM library picks its micro-kernel by the rows it is given: on an AVX2 EPYC (oneDNN/MKL, fp32) the rows
past the last multiple of 4 of a call with fewer than 12 rows come out of another kernel and differ in their
last bits. Padding every call's rows to a multiple of `row_pad` sends each row through the same kernel
whatever the batch. The pad is not assumed: invariance.probe_row_pad measures it at start-up on the model's
own weights.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def pad_rows(x: torch.Tensor, row_pad: int) -> torch.Tensor:
    """x [n, ...] with zero rows appended up to a multiple of row_pad."""
    extra = -x.shape[0] % row_pad
    return x if extra == 0 else F.pad(x, (0, 0) * (x.dim() - 1) + (0, extra))


def linear(x: torch.Tensor, weight: torch.Tensor, row_pad: int) -> torch.Tensor:
    """F.linear(x, weight) for x [n, in], each row computed as it would be in any other batch."""
    n = x.shape[0]
    return F.linear(pad_rows(x, row_pad), weight)[:n]
