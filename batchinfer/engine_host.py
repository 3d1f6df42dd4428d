"""The one model per process: a worker (or `batchinfer run`) loads it once and reuses it for every unit."""
from __future__ import annotations

import json
import logging
import time
from functools import lru_cache
from pathlib import Path

from batchinfer.settings import Settings

log = logging.getLogger(__name__)
_generators: dict[tuple, object] = {}


def _engine_config(settings: Settings):
    from batchinfer.engine import EngineConfig

    device = settings.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return EngineConfig(device=device, kv_cache_bytes=settings.kv_cache_bytes)


def get_generator(settings: Settings):
    """LLMEngine (or the transformers reference when BATCHINFER_ENGINE=hf), loaded once per process."""
    key = (settings.engine, settings.model, str(settings.model_cache), settings.kv_cache_bytes)
    if key not in _generators:
        started = time.time()
        _generators[key] = _load(settings)
        log.info("model loaded in %.1f s", time.time() - started)
    return _generators[key]


def _load(settings: Settings):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bar tells the story
    if settings.engine == "batchinfer":
        from batchinfer.engine import LLMEngine

        return LLMEngine.from_pretrained(settings.model, str(settings.model_cache), _engine_config(settings))
    from batchinfer.hf_generate import HFGenerator

    return HFGenerator.from_pretrained(settings.model, str(settings.model_cache))


class _LazyTokenizer:
    """Loads the tokenizer (and transformers, and torch) on first use: a file that fails early never pays for it."""

    def __init__(self, folder: Path):
        self._folder = folder
        self._tokenizer = None

    def __getattr__(self, name: str):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._folder)
        return getattr(self._tokenizer, name)


@lru_cache(maxsize=4)
def _tokenizer_and_len(model: str | None, cache_dir: str):
    from batchinfer.engine.loader import resolve_model_dir

    folder = resolve_model_dir(model, cache_dir)
    config = json.loads((folder / "config.json").read_text())
    return _LazyTokenizer(folder), int(config.get("max_position_embeddings", 8192))


def tokenizer_and_context(settings: Settings):
    """The tokenizer and context length for validation, without loading the weights when no model is loaded."""
    for key, generator in _generators.items():
        if key[1:3] == (settings.model, str(settings.model_cache)):
            return generator.tokenizer, generator.max_model_len
    return _tokenizer_and_len(settings.model, str(settings.model_cache))
