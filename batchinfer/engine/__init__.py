"""The batchinfer engine: continuous batching over a paged KV cache with prefix caching.

The names below load on first use (PEP 562), so a process that only needs the engine's plain types or the
tokenizer (`submit`, `status`, the API) never imports torch."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import EngineConfig
    from .llm_engine import LLMEngine
    from .types import GenerationRequest, GenerationResult, SamplingParams

_EXPORTS = {"EngineConfig": ".config", "LLMEngine": ".llm_engine", "GenerationRequest": ".types",
            "GenerationResult": ".types", "SamplingParams": ".types"}
__all__ = ["EngineConfig", "GenerationRequest", "GenerationResult", "LLMEngine", "SamplingParams"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
