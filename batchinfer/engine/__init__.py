"""The batchinfer engine: continuous batching over a paged KV cache with prefix caching.

The names below load on first use (PEP 562): `batchinfer.engine.types` is imported by the job layer and
the CLI, which must not pay for torch (seconds) unless they run the engine.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .types import GenerationRequest, GenerationResult, SamplingParams

if TYPE_CHECKING:
    from .config import EngineConfig
    from .llm_engine import LLMEngine

_LAZY = {"EngineConfig": ".config", "LLMEngine": ".llm_engine"}
__all__ = ["EngineConfig", "GenerationRequest", "GenerationResult", "LLMEngine", "SamplingParams"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
