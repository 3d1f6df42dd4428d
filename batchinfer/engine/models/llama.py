"""Llama (and SmolLM2, Llama 3.x): the base every other family states its differences from."""
from __future__ import annotations

from .spec import ModelSpec, base_spec


def spec(cfg, architecture: str) -> ModelSpec:
    return base_spec(cfg, architecture)
