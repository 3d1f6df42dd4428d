"""Attention backends behind one contract (base.py); pick one by name."""
from __future__ import annotations

from .base import AttentionBackend, AttentionMetadata


def make_attention_backend(name: str, device: str) -> AttentionBackend:
    """"auto" takes Triton on a GPU when it imports, the torch backend otherwise."""
    if name == "auto":
        name = "triton" if str(device).startswith("cuda") and _triton_available() else "torch"
    if name == "triton":
        from .triton_backend import TritonAttentionBackend
        return TritonAttentionBackend()
    from .torch_backend import TorchAttentionBackend
    return TorchAttentionBackend()


def _triton_available() -> bool:
    try:
        from . import triton_backend  # noqa: F401
    except ImportError:
        return False
    return True


__all__ = ["AttentionBackend", "AttentionMetadata", "make_attention_backend"]
