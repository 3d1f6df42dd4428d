"""The one dense linear every projection, expert and LM head goes through, made batch-invariant.

A GEMM library picks its micro-kernel by the rows it is given: on an AVX2 EPYC (oneDNN/MKL, fp32) the rows
past the last multiple of 4 of a call with fewer than 12 rows come out of another kernel and differ in their
last bits. Padding every call's rows to a multiple of `row_pad` sends each row through the same kernel
whatever the batch. Some libraries also change kernels (and K blocking) past some row count: on an AMX Xeon
(oneDNN, fp32) a K=1536 row of a 64-row call differs from the same row in a 48-row call whatever the pad. So
a call may also be cut into calls of at most `max_rows` rows. Neither is assumed: invariance.probe_row_pad
measures both at start-up on the model's own weights.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class RowPlan(NamedTuple):
    """How a dense linear's rows are cut into calls: padded to a multiple of pad, at most max_rows a call (0: any)."""
    pad: int = 4
    max_rows: int = 0


def pad_rows(x: torch.Tensor, row_pad: int) -> torch.Tensor:
    """x [n, ...] with zero rows appended up to a multiple of row_pad."""
    extra = -x.shape[0] % row_pad
    return x if extra == 0 else F.pad(x, (0, 0) * (x.dim() - 1) + (0, extra))


def linear(x: torch.Tensor, weight: torch.Tensor, rows: RowPlan) -> torch.Tensor:
    """F.linear(x, weight) for x [n, in], each row computed as it would be in any other batch."""
    n, (pad, most) = x.shape[0], rows
    if most and n > most:
        return torch.cat([F.linear(pad_rows(x[i:i + most], pad), weight)[:min(most, n - i)] for i in range(0, n, most)])
    return F.linear(pad_rows(x, pad), weight)[:n]
