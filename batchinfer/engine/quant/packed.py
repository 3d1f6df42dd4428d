"""Linear layers over GGUF blocks in the kernel's packed layout: y = x @ W^T with x quantized per row to int8.

A PackedWeight is one GGUF tensor (any block type the kernel reads), repacked once (repack) and mapped from the
cache file after that; StackedWeight runs several (q, k, v; gate, up) into column ranges of one output, each in
its own block type, sharing one quantization of x per scheme. Rows are quantized one by one and every product is
an exact integer sum, so a row's output never depends on the rows beside it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .kernel import SUPER, TYPES, Kernel, Packer

PANEL = 16


@dataclass
class Acts:
    """x quantized for one scheme: 32-types (Q8_0/Q8_1) or K-quants (Q8_K)."""
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

    @property
    def scheme(self) -> int:
        return SUPER[self.qtype]

    def matmul(self, acts: Acts, out_ptr: int, ldy: int, threads: int) -> None:
        """The float32 output at out_ptr [rows, >= n] (rows ldy floats apart) <- acts @ W^T."""
        rows = acts.rows
        self.kernel.lib.gemm(self.type_id, acts.q.data_ptr(), acts.d.data_ptr(), acts.s.data_ptr(),
                             acts.bsum.data_ptr(), rows, self.k, self.data_ptr, self.n, out_ptr, ldy,
                             self.kernel.path_for(rows, self.qtype), threads)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return StackedWeight([self])(x)


@dataclass
class StackedWeight:
    parts: list[PackedWeight]

    def __post_init__(self) -> None:
        self.n = sum(p.n for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """A decode step calls this a few hundred times on a few rows: the Python around the kernel is kept short
        (the output's columns by pointer, no views; one thread count)."""
        dtype, shape = x.dtype, x.shape
        # rows apart (a gated half of gate_up) are read where they are
        if x.dim() != 2 or dtype != torch.float32 or x.stride(1) != 1:
            x = x.reshape(-1, shape[-1]).to(torch.float32).contiguous()
        out = torch.empty(x.shape[0], self.n, dtype=torch.float32)
        threads, ptr, ldy = torch.get_num_threads(), out.data_ptr(), self.n
        acts: dict[int, Acts] = {}
        col = 0
        for part in self.parts:
            scheme = part.scheme
            if scheme not in acts:
                acts[scheme] = quantize(part.kernel, part.qtype, x, threads)
            part.matmul(acts[scheme], ptr + 4 * col, ldy, threads)
            col += part.n
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
