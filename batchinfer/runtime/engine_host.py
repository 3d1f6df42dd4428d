"""The one model per process: a worker (or `batchinfer run`) loads it once and reuses it for every unit."""
from __future__ import annotations

import logging
import sys
import time

from batchinfer.jobs.intake.tokenizer import remember_tokenizer
from batchinfer.settings import Settings
from batchinfer.runtime.null_generator import NullGenerator

log = logging.getLogger(__name__)
_generators: dict[tuple, object] = {}


def engine_config(settings: Settings):
    """The EngineConfig a worker runs with; the planner takes its block size from here too."""
    from batchinfer.engine import EngineConfig  # lazy: torch

    device = settings.device
    if device is None:
        import torch  # lazy: torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return EngineConfig(device=device, kv_cache_bytes=settings.kv_cache_bytes, dtype=settings.dtype,
                        block_size=settings.kv_block_size, pooling=settings.embedding_pooling,
                        weight_format=settings.weight_format, max_loras=settings.max_loaded_adapters)


def get_generator(settings: Settings):
    """LLMEngine (or the transformers reference when BATCHINFER_ENGINE=hf, or the null engine when =null),
    loaded once per process."""
    key = generator_key(settings)
    if key not in _generators:
        started = time.time()
        _generators[key] = generator = _load(settings)
        remember_tokenizer(settings, generator.tokenizer, generator.max_model_len)
        log.info("model loaded in %.1f s", time.time() - started)
        described = generator.description
        print(f"dtype {described.dtype_note}", file=sys.stderr)  # once per process: the model is loaded once
        if described.weights_note is not None:  # LLMEngine's; the hf and null engines have no weight formats
            print(f"weights {described.weights_note}", file=sys.stderr)
    return _generators[key]


def generator_key(settings: Settings) -> tuple:
    """Settings with the same key share one loaded generator."""
    return (settings.engine, settings.model, str(settings.model_cache), settings.kv_cache_bytes, settings.dtype,
            settings.kv_block_size, settings.embedding_pooling, settings.weight_format, settings.max_loaded_adapters)


def _load(settings: Settings):
    if settings.engine == "null":  # only when named: the validator knows no other spelling, the default is batchinfer
        return NullGenerator.from_settings(settings)
    if settings.engine == "batchinfer":
        from batchinfer.engine import LLMEngine  # lazy: torch

        return LLMEngine.from_pretrained(settings.model, str(settings.model_cache), engine_config(settings))
    from transformers.utils import logging as hf_logging  # lazy: transformers and torch, for the reference engine only

    from batchinfer.runtime.hf_generate import HFGenerator

    hf_logging.disable_progress_bar()  # our own progress bar tells the story
    return HFGenerator.from_pretrained(settings.model, str(settings.model_cache), engine_config(settings))
