"""The decoder's norms, residual adds and activation: torch's ops (TorchOps, every model), or one C pass each
(CpuOps, cpu_ops.c) for a quantized model's float32 path on the CPU, whose bits are its own already (the GGUF
blocks, integer dots): torch's RMSNorm is seven ops and SwiGLU two, each a pass over memory and a dispatch
(0.1 s of SmolLM2's shared-document run of 0.94 s). A dense model keeps torch's ops: identical to transformers.
"""
from __future__ import annotations

import ctypes
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from ..machine.native_build import NativeKernelUnavailable, built_library
from .activation import gated

SOURCE = Path(__file__).with_name("cpu_ops.c")
_builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-ops-build")


class TorchOps:
    """torch's forms (the dense models' bits, transformers' own)."""

    def __init__(self, hidden_size: int, eps: float):
        self.hidden_size, self.eps = hidden_size, eps

    def norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return x if weight is None else F.rms_norm(x, (self.hidden_size,), weight, self.eps)

    def add_norm(self, hidden: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """hidden += y (in place: the sum's bits as `hidden + y`); then hidden's norm, or hidden when no weight."""
        return self.norm(hidden.add_(y), weight)

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        return gated(gate_up, activation)


class CpuOps(TorchOps):
    """The same steps in cpu_ops.c: one pass a row, batch-invariant, the same bits on AVX2 and AVX-512."""

    def __init__(self, hidden_size: int, eps: float, lib: ctypes.CDLL, avx2_only: bool = False):
        super().__init__(hidden_size, eps)
        self.lib, self.avx2_only = lib, avx2_only

    def norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if weight is None or not (_rows(x) and _vector(weight)):
            return super().norm(x, weight)
        return self._add_norm(x, None, weight)

    def add_norm(self, hidden: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if not (_rows(hidden) and _rows(y) and y.shape == hidden.shape and (weight is None or _vector(weight))):
            return super().add_norm(hidden, y, weight)
        return self._add_norm(hidden, y, weight)

    def gated(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        if activation != "silu" or not _rows(gate_up):
            return gated(gate_up, activation)
        n, inter = gate_up.shape[0], gate_up.shape[1] // 2
        self.lib.silu_mul(gate_up.data_ptr(), gate_up.stride(0), n, inter, torch.get_num_threads(), self.avx2_only)
        return gate_up[:, :inter]

    def _add_norm(self, x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor | None) -> torch.Tensor:
        """x += y where given; then x's norm, or x itself when no weight."""
        n, h = x.shape
        out = torch.empty(n, h, dtype=torch.float32) if weight is not None else x
        self.lib.add_rms_norm(x.data_ptr(), x.stride(0), None if y is None else y.data_ptr(),
                              0 if y is None else y.stride(0), None if weight is None else weight.data_ptr(),
                              self.eps, n, h, out.data_ptr(), torch.get_num_threads(), self.avx2_only)
        return out


def _rows(x: torch.Tensor) -> bool:
    """float32 rows the kernel takes: two dimensions, each row contiguous."""
    return x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1


def _vector(w: torch.Tensor) -> bool:
    return w.dtype == torch.float32 and w.is_contiguous()


@lru_cache(maxsize=4)
def start_ops_build(cache_dir: str) -> Future:
    """cpu_ops.c compiled in the background, beside the model's load (a first run's only)."""
    return _builds.submit(built_library, SOURCE, cache_dir, "CPU norm and activation kernel")


@lru_cache(maxsize=4)
def load_ops(cache_dir: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(start_ops_build(cache_dir).result()))  # after torch: its libgomp resolves ours
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.add_rms_norm.argtypes = [ptr, i64, ptr, i64, ptr, f32, i64, i32, ptr, i32, i32]
    lib.add_rms_norm.restype = None
    lib.silu_mul.argtypes = [ptr, i64, i64, i32, i32, i32]
    lib.silu_mul.restype = None
    return lib


def decoder_ops(hidden_size: int, eps: float, quantized: bool, device: torch.device, dtype: torch.dtype,
                cache_dir: str | None) -> TorchOps:
    """CpuOps for a quantized float32 model on the CPU where the kernel builds; TorchOps otherwise."""
    if not quantized or device.type != "cpu" or dtype != torch.float32 or cache_dir is None:
        return TorchOps(hidden_size, eps)
    try:
        return CpuOps(hidden_size, eps, load_ops(cache_dir))
    except NativeKernelUnavailable:
        return TorchOps(hidden_size, eps)
