"""Attention on the CPU with our C kernel (cpu_kernel.c): reads the paged cache in place, batch-invariant.

The torch backend (chunked.py) gathers every sequence's keys into a padded batch and runs a few small GEMMs per
64-key chunk; on a CPU those gathers and tiny GEMMs cost several times the arithmetic. The kernel walks each
row's keys through its block table instead, with each block's keys transposed ([kv heads, head_dim, block_size]
in the block's place: keys_in_base_layout reads them back). float32, head_dim a multiple of 16 up to 256, at most
32 query heads per KV head; anything else takes the torch backend (for every layer alike: the layout is chosen
once per model). A block_size that is not a multiple of 16 works, slower, with the same bits.
"""
from __future__ import annotations

import ctypes
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import torch

from ..machine.native_build import built_library
from .base import AttentionBackend, AttentionMetadata
from .torch_backend import TorchAttentionBackend

SOURCE = Path(__file__).with_name("cpu_kernel.c")
MAX_HEAD_DIM, MAX_ROWS = 256, 32  # key vectors copied out of small blocks fit the stack; cpu_kernel.c MAX_ROWS
LANES, SCORE_ROWS, SCORE_PAD = 16, 4, 32  # keys a vector; cpu_kernel.c RG and SCORE_PAD (its scratch)


_builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attention-build")


@lru_cache(maxsize=4)
def start_attention_build(cache_dir: str) -> Future:
    """The kernel compiled in the background (a first run's gcc beside the model's load, not after it: 1.2 s of
    its critical path on a Zen 4); load_attention_kernel takes the result, NativeKernelUnavailable included."""
    return _builds.submit(built_library, SOURCE, cache_dir, "CPU attention kernel")


@lru_cache(maxsize=1)
def load_attention_kernel(cache_dir: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(start_attention_build(cache_dir).result()))  # torch (its libgomp) is loaded: our import
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    lib.paged_attention.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i32, i32, i32, ptr, ptr, i64, ptr, i64, i32,
                                    f32, i64, f32, ptr, i64, i32, i32]
    lib.paged_attention.restype = None
    lib.rope_split.argtypes = [ptr, i64, i64, i32, i32, i32, ptr, ptr, ptr, ptr, i32]
    lib.rope_split.restype = None
    return lib


def kernel_fits(dtype: torch.dtype, head_dim: int, group: int) -> bool:
    return dtype == torch.float32 and head_dim % LANES == 0 and head_dim <= MAX_HEAD_DIM and group <= MAX_ROWS


def keys_in_base_layout(k_cache: torch.Tensor) -> torch.Tensor:
    """The kernel's key cache as the base layout [blocks, block_size, kv heads, head_dim] (a view)."""
    blocks, bs, hkv, d = k_cache.shape
    return k_cache.view(blocks, hkv, d, bs).permute(0, 3, 1, 2)


def keys_in_kernel_layout(k_cache: torch.Tensor) -> torch.Tensor:
    """A base-layout key cache copied into the kernel's layout (the same shape)."""
    blocks, bs, hkv, d = k_cache.shape
    return k_cache.permute(0, 2, 3, 1).contiguous().view(blocks, bs, hkv, d)


class CpuAttentionBackend(AttentionBackend):
    def __init__(self, cache_dir: str, avx2_only: bool = False):
        self.lib = load_attention_kernel(cache_dir)
        self.avx2_only = avx2_only  # the AVX2 build on an AVX-512 CPU too (the tests compare their bits)
        self.fallback = TorchAttentionBackend()  # bf16/fp16 engines, odd head sizes
        self._plan_for: AttentionMetadata | None = None
        self._plan: tuple[int, tuple[torch.Tensor, ...]] | None = None

    @property
    def row_pad(self) -> int:  # the runner sets the probed GEMM row pad; only the fallback's GEMMs use it
        return self.fallback.row_pad

    @row_pad.setter
    def row_pad(self, value: int) -> None:
        self.fallback.row_pad = value

    def rope(self, qk, cos, sin, num_q_heads):
        """The C form of the base's torch RoPE (same bits), writing q and k contiguous: five torch ops and two copies
        a layer fewer."""
        n, heads, d = qk.shape
        if qk.dtype != torch.float32 or cos.dtype != torch.float32 or d % 2 or qk.stride(2) != 1 or qk.stride(1) != d:
            return super().rope(qk, cos, sin, num_q_heads)
        cos, sin = cos.reshape(n, d).contiguous(), sin.reshape(n, d).contiguous()
        q = torch.empty(n, num_q_heads, d, dtype=torch.float32)
        k = torch.empty(n, heads - num_q_heads, d, dtype=torch.float32)
        self.lib.rope_split(qk.data_ptr(), qk.stride(0), n, num_q_heads, heads - num_q_heads, d, cos.data_ptr(),
                            sin.data_ptr(), q.data_ptr(), k.data_ptr(), torch.get_num_threads())
        return q, k

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        if not kernel_fits(q.dtype, q.shape[-1], q.shape[1] // k.shape[1]) or k_cache.dtype != torch.float32:
            return self.fallback.forward(q, k, v, k_cache, v_cache, meta, scale, window, softcap)
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = torch.empty_like(q)
        group = q.shape[1] // k.shape[1]
        pos, tiles, tables, slots = self._get_plan(meta, max(1, MAX_ROWS // group))
        threads = torch.get_num_threads()
        scratch = torch.empty(threads * SCORE_ROWS * (meta.max_seq_len + SCORE_PAD), dtype=torch.float32)
        self.lib.paged_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                 slots.data_ptr(), out.data_ptr(), q.shape[0], q.shape[1], k_cache.shape[2],
                                 q.shape[2], pos.data_ptr(), tiles.data_ptr(), tiles.shape[0], tables.data_ptr(),
                                 tables.shape[1], k_cache.shape[1], scale, window or 0, softcap or 0.0,
                                 scratch.data_ptr(), meta.max_seq_len, threads, self.avx2_only)
        return out

    def _get_plan(self, meta: AttentionMetadata, tile_tokens: int) -> tuple[torch.Tensor, ...]:
        """Each new token's position, the tiles (sequence, first token, tokens: consecutive tokens of one sequence
        that share reads of its keys), the block tables and the slots: once per step, shared by every layer."""
        if self._plan_for is not meta or self._plan is None or self._plan[0] != tile_tokens:
            cu, seq_lens = meta.cu_seqlens_q.tolist(), meta.seq_lens.tolist()
            pos: list[int] = []
            tiles: list[tuple[int, int, int]] = []
            for i, total in enumerate(seq_lens):
                q_len = cu[i + 1] - cu[i]
                pos += range(total - q_len, total)
                tiles += [(i, cu[i] + t, min(tile_tokens, q_len - t)) for t in range(0, q_len, tile_tokens)]
            plan = (torch.tensor(pos, dtype=torch.int32), torch.tensor(tiles, dtype=torch.int32).reshape(-1, 3),
                    meta.block_tables.to(torch.int32).contiguous(), meta.slot_mapping.to(torch.int64).contiguous())
            self._plan_for, self._plan = meta, (tile_tokens, plan)
        return self._plan[1]
