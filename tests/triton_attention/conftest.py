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

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_MODULES = ("store_kv", "extend_attention")

if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
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
