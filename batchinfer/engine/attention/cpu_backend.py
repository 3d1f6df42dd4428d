"""Attention on the CPU with our C kernel (cpu_kernel.c): reads the paged cache in place, batch-invariant.

The torch backend (chunked.py) gathers every sequence's keys into a padded batch and runs a few small GEMMs per
64-key chunk; on a CPU those gathers and tiny GEMMs cost several times the arithmetic. The kernel walks each
row's keys through its block table instead. float32 only: other dtypes (and more than 16 query heads per KV head) take the torch backend.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import torch

from ..native_build import build_library
from .base import AttentionBackend, AttentionMetadata
from .torch_backend import TorchAttentionBackend

SOURCE = Path(__file__).with_name("cpu_kernel.c")
MAX_HEAD_DIM, MAX_GROUP, KEYS = 256, 16, 8  # cpu_kernel.c MAX_D, MAX_G, KEYS


@lru_cache(maxsize=1)
def load_attention_kernel(cache_dir: str) -> ctypes.CDLL:
    lib = build_library(SOURCE, cache_dir, "CPU attention kernel")
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.paged_attention.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i32, i32, i32, ptr, ptr, ptr, i64, i32, f32,
                                    i64, f32, ptr, i64, i32]
    lib.paged_attention.restype = None
    return lib


def kernel_fits(dtype: torch.dtype, head_dim: int, group: int) -> bool:
    return dtype == torch.float32 and head_dim % 8 == 0 and head_dim <= MAX_HEAD_DIM and group <= MAX_GROUP


class CpuAttentionBackend(AttentionBackend):
    def __init__(self, cache_dir: str):
        self.lib = load_attention_kernel(cache_dir)
        self.fallback = TorchAttentionBackend()  # bf16/fp16 engines, odd head sizes
        self._plan_for: AttentionMetadata | None = None
        self._plan: tuple[torch.Tensor, ...] | None = None

    @property
    def row_pad(self) -> int:  # the runner sets the probed GEMM row pad; only the fallback's GEMMs use it
        return self.fallback.row_pad

    @row_pad.setter
    def row_pad(self, value: int) -> None:
        self.fallback.row_pad = value

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        if not kernel_fits(q.dtype, q.shape[-1], q.shape[1] // k.shape[1]) or k_cache.dtype != torch.float32:
            return self.fallback.forward(q, k, v, k_cache, v_cache, meta, scale, window, softcap)
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = torch.empty_like(q)
        seq, pos, tables, slots = self._get_plan(meta)
        threads = torch.get_num_threads()
        scratch = torch.empty(threads * q.shape[1] // k.shape[1] * (meta.max_seq_len + KEYS), dtype=torch.float32)
        self.lib.paged_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                 slots.data_ptr(), out.data_ptr(), q.shape[0], q.shape[1], k_cache.shape[2],
                                 q.shape[2], seq.data_ptr(), pos.data_ptr(), tables.data_ptr(), tables.shape[1],
                                 k_cache.shape[1], scale, window or 0, softcap or 0.0, scratch.data_ptr(),
                                 meta.max_seq_len, threads)
        return out

    def _get_plan(self, meta: AttentionMetadata) -> tuple[torch.Tensor, ...]:
        """Each new token's row in the block tables, its position and its cache slot: once per step, shared by
        every layer."""
        if self._plan_for is not meta:
            cu = meta.cu_seqlens_q.long()
            q_lens = cu[1:] - cu[:-1]
            seq = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens)
            first = (meta.seq_lens.long() - q_lens)[seq]  # the position of each sequence's first new token
            pos = first + torch.arange(len(seq)) - cu[:-1][seq]
            tables = meta.block_tables.to(torch.int32).contiguous()
            slots = meta.slot_mapping.to(torch.int64).contiguous()
            self._plan_for, self._plan = meta, (seq.to(torch.int32), pos.to(torch.int32), tables, slots)
        assert self._plan is not None
        return self._plan
