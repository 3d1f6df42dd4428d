"""Triton kernel tests. Without CUDA they run under the Triton interpreter on CPU.

triton.jit picks interpreter or compiler when a kernel is decorated, i.e. when its module is
imported, so TRITON_INTERPRET must be set before the kernel modules load; if an earlier test module
already imported them (as compiled kernels, useless on CPU), they are reloaded here.
"""
from __future__ import annotations

import functools
import importlib
import os
import sys

import numpy as np
import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_MODULES = ("store_kv", "extend_attention")



def _fixed_order_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """tl.dot as a GPU's tensor cores compute it: each output one sum over k in order, whatever the other rows.
    The interpreter's own np.matmul goes to the CPU's BLAS, whose sgemm on AVX2 gives a row other last bits
    depending on its place in the call, which made the bitwise invariance tests fail there and not on a GPU."""
    from triton.runtime.interpreter import TensorHandle

    acc = d.data.dtype
    x, y = a.data.astype(acc), b.data.astype(acc)
    out = np.zeros(x.shape[:-1] + y.shape[-1:], dtype=acc)
    for k in range(x.shape[-1]):
        out += x[..., :, k, None] * y[..., None, k, :]
    return TensorHandle(out + d.data, d.dtype.scalar)


if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.runtime.interpreter import InterpreterBuilder

    InterpreterBuilder.create_dot = _fixed_order_dot
    for _name in KERNEL_MODULES:
        _module = sys.modules.get(f"batchinfer.engine.kernels.{_name}")
        if _module is not None:
            importlib.reload(_module)

from benchmarks.support.paged_batch import PagedBatch  # noqa: E402


TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=1e-2),
             torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture
def paged_batch():
    """Builds a PagedBatch on the test device."""
    return functools.partial(PagedBatch, device=DEVICE)


@pytest.fixture
def tolerance():
    """assert_close keyword arguments for a dtype."""
    return TOLERANCE.__getitem__
