"""The batchinfer engine: continuous batching over a paged KV cache with prefix caching."""
from .config import EngineConfig
from .llm_engine import LLMEngine
from .types import GenerationRequest, GenerationResult, SamplingParams

__all__ = ["EngineConfig", "GenerationRequest", "GenerationResult", "LLMEngine", "SamplingParams"]
