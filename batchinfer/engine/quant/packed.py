"""Linear layers over GGUF blocks in the kernel's packed layout: y = x @ W^T with x quantized per row to int8.

A PackedWeight is one GGUF tensor (any block type the kernel reads), repacked once (repack) and mapped from the
cache file after that; StackedWeight runs several (q, k, v; gate, up) into column ranges of one output, each in
its own block type, sharing one quantization of x per scheme. Rows are quantized one by one and every product is
an exact integer sum, so a row's output never depends on the rows beside it.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from .kernel import SUPER, TYPES, Kernel, Packer

PANEL = 16


@dataclass
class Acts:
    """x quantized for one scheme: 32-types (Q8_0/Q8_1) or K-quants (Q8_K). With quantize and PackedWeight.matmul,
    the kernel's two-call form: the engine calls StackedWeight (one call); the tests check it against this."""
    q: torch.Tensor  # int8 [rows padded to 32, K]
    d: torch.Tensor
    s: torch.Tensor
    bsum: torch.Tensor
    rows: int


def quantize(kernel: Kernel, qtype: str, x: torch.Tensor, threads: int | None = None) -> Acts:
    """x: float32 [m, k], its rows contiguous (any row stride)."""
    m, k = x.shape
    sb = SUPER[qtype]
    padded = -(-m // 32) * 32  # two AMX tiles of 16 rows
    q = torch.empty(padded, k, dtype=torch.int8)
    d = torch.empty(m, k // sb, dtype=torch.float32)
    s = torch.empty(m, k // 32 if sb == 32 else 1, dtype=torch.float32)
    bsum = torch.empty(m, k // (32 if sb == 32 else 16), dtype=torch.int32)
    kernel.lib.quantize_acts(TYPES[qtype], x.data_ptr(), x.stride(0), m, k, padded, q.data_ptr(), d.data_ptr(),
                             s.data_ptr(), bsum.data_ptr(), threads or torch.get_num_threads())
    return Acts(q, d, s, bsum, m)


@dataclass
class PackedWeight:
    qtype: str
    n: int
    k: int
    data: np.ndarray  # uint8, the packed panels (a view of the mapped cache file)
    kernel: Kernel

    def __post_init__(self) -> None:
        self.type_id, self.data_ptr = TYPES[self.qtype], self.data.ctypes.data
        self._alone: StackedWeight | None = None  # this weight as a projection of its own, made on first call

    def matmul(self, acts: Acts, out_ptr: int, ldy: int, threads: int) -> None:
        """The float32 output at out_ptr [rows, >= n] (rows ldy floats apart) <- acts @ W^T."""
        rows = acts.rows
        self.kernel.lib.gemm(self.type_id, acts.q.data_ptr(), acts.d.data_ptr(), acts.s.data_ptr(),
                             acts.bsum.data_ptr(), rows, self.k, self.data_ptr, self.n, out_ptr, ldy,
                             self.kernel.path_for(rows, self.qtype), threads)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._alone is None:
            self._alone = StackedWeight([self])
        return self._alone(x)


@dataclass
class StackedWeight:
    parts: list[PackedWeight]

    def __post_init__(self) -> None:
        self.n = sum(p.n for p in self.parts)
        self.kernel = self.parts[0].kernel
        assert all(p.kernel is self.kernel and p.k == self.parts[0].k for p in self.parts)
        count = len(self.parts)  # the C side's arrays, made once
        self._types = (ctypes.c_int32 * count)(*(p.type_id for p in self.parts))
        self._ws = (ctypes.c_void_p * count)(*(p.data_ptr for p in self.parts))
        self._ns = (ctypes.c_int64 * count)(*(p.n for p in self.parts))
        self._paths: dict[tuple[int, ...], ctypes.Array] = {}  # at most two a part: AMX or not by the rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """A decode step calls this a few hundred times on a few rows: one foreign call (qkernel.c's linear, which
        quantizes x once per scheme into its own scratch), the output's columns by pointer, one thread count."""
        dtype, shape = x.dtype, x.shape
        # rows apart (a gated half of gate_up) are read where they are
        if x.dim() != 2 or dtype != torch.float32 or x.stride(1) != 1:
            x = x.reshape(-1, shape[-1]).to(torch.float32).contiguous()
        m, k = x.shape
        out = torch.empty(m, self.n, dtype=torch.float32)
        key = tuple(self.kernel.path_for(m, p.qtype) for p in self.parts)
        paths = self._paths.get(key) or self._paths.setdefault(key, (ctypes.c_int32 * len(key))(*key))
        if self.kernel.lib.linear(len(self.parts), self._types, self._ws, self._ns, paths, x.data_ptr(), x.stride(0),
                                  m, k, out.data_ptr(), self.n, torch.get_num_threads()):
            raise MemoryError(f"the integer kernel's activations for {m} rows of {k}")
        if len(shape) == 2 and dtype == torch.float32:
            return out
        return out.view(*shape[:-1], self.n).to(dtype)


def packed_size(kernel: Kernel | Packer, qtype: str, n: int, k: int) -> int:
    return int(kernel.lib.packed_bytes(TYPES[qtype], n, k))


def repack(kernel: Kernel | Packer, qtype: str, raw: np.ndarray, n: int, k: int, out: np.ndarray,
           rows: np.ndarray | None = None) -> None:
    """raw: the GGUF tensor's bytes [n rows of k / block weights] -> out (packed_size bytes); output row i is raw
    row rows[i] where rows is given."""
    order = None if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    kernel.lib.repack(TYPES[qtype], raw.ctypes.data, raw.nbytes // n, n, k, None if order is None else order.ctypes.data,
                      out.ctypes.data, torch.get_num_threads())


def dequantize_rows(kernel: Kernel, qtype: str, raw: np.ndarray, n: int, k: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of a GGUF tensor as float32 [len(ids), k], as gguf's dequantize computes them."""
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), k, dtype=torch.float32)
    kernel.lib.dequant_rows(TYPES[qtype], raw.ctypes.data, raw.nbytes // n, k, ids.data_ptr(), ids.numel(),
                            out.data_ptr(), torch.get_num_threads())
    return out
