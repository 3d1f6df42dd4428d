"""Attention backends behind one contract (base.py); pick one by name."""
from __future__ import annotations

import torch

from .base import AttentionBackend, AttentionMetadata


def make_attention_backend(name: str, device: str, cache_dir: str | None = None,
                           dtype: torch.dtype = torch.float32) -> AttentionBackend:
    """"auto" takes Triton on a GPU when it imports; on a CPU our C kernel for float32 where this machine can
    build it (cpu_backend.py), else the torch backend."""
    if name == "auto":
        name = _auto(device, dtype, cache_dir)
    if name == "triton":
        from .triton_backend import TritonAttentionBackend  # lazy: the backend asked for (triton only on a GPU)
        return TritonAttentionBackend()
    if name == "cpu":
        from .cpu_backend import CpuAttentionBackend  # lazy: the backend asked for (triton only on a GPU)
        return CpuAttentionBackend(cache_dir or _user_cache())
    from .torch_backend import TorchAttentionBackend  # lazy: the backend asked for (triton only on a GPU)
    return TorchAttentionBackend()


def _auto(device: str, dtype: torch.dtype, cache_dir: str | None) -> str:
    if str(device).startswith("cuda"):
        return "triton" if _triton_available() else "torch"
    if dtype != torch.float32:
        return "torch"
    from ..machine.native_build import NativeKernelUnavailable  # lazy: only for the CPU backend
    from .cpu_backend import load_attention_kernel  # lazy: the backend asked for (triton only on a GPU)
    try:
        load_attention_kernel(cache_dir or _user_cache())
    except NativeKernelUnavailable:
        return "torch"
    return "cpu"


def _user_cache() -> str:
    from ..machine.native_build import user_cache  # lazy: only for the CPU backend

    return str(user_cache())


def _triton_available() -> bool:
    try:
        from . import triton_backend  # noqa: F401
    except ImportError:
        return False
    return True


__all__ = ["AttentionBackend", "AttentionMetadata", "make_attention_backend"]
