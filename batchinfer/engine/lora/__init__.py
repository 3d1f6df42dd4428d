"""LoRA adapters over the base model: read from peft's files, fused to the engine's projections, applied per row
(rows of different adapters share a step; the base projection runs once for all of them)."""
from .request import LoRARequest

__all__ = ["LoRARequest"]
