"""The one model per process: a worker (or `batchinfer run`) loads it once and reuses it for every unit."""
from __future__ import annotations

import dataclasses
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from batchinfer.jobs.intake.tokenizer import remember_tokenizer
from batchinfer.runtime.null_generator import NullGenerator

if TYPE_CHECKING:  # pydantic: the engine process never imports it (engine_process.py)
    from batchinfer.settings import Settings

log = logging.getLogger(__name__)
_generators: dict[tuple, object] = {}


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """The settings a model's load reads, as plain values: what the engine process is sent (it imports no pydantic:
    0.13 s of its start, before torch)."""
    engine: str
    model: str | None
    model_cache: str
    kv_cache_bytes: int | None
    dtype: str
    kv_block_size: int
    embedding_pooling: str
    weight_format: str
    max_loaded_adapters: int
    device: str | None
    detokenize: bool = True  # EngineConfig.detokenize: the engine process's parent decodes its results

    @classmethod
    def of(cls, settings: Settings | EngineSettings) -> EngineSettings:
        values: dict[str, Any] = {f.name: getattr(settings, f.name) if f.default is dataclasses.MISSING
                                  else getattr(settings, f.name, f.default) for f in dataclasses.fields(cls)}
        return cls(**values | {"model_cache": str(settings.model_cache)})


def engine_config(settings: Settings | EngineSettings):
    """The EngineConfig a worker runs with; the planner takes its block size from here too."""
    from batchinfer.engine import EngineConfig  # lazy: torch

    device = settings.device
    if device is None:
        import torch  # lazy: torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return EngineConfig(device=device, kv_cache_bytes=settings.kv_cache_bytes, dtype=settings.dtype,
                        block_size=settings.kv_block_size, pooling=settings.embedding_pooling,
                        weight_format=settings.weight_format, max_loras=settings.max_loaded_adapters,
                        detokenize=getattr(settings, "detokenize", True))


def get_generator(settings: Settings | EngineSettings):
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


def generator_key(settings: Settings | EngineSettings) -> tuple:
    """Settings with the same key share one loaded generator."""
    return dataclasses.astuple(dataclasses.replace(EngineSettings.of(settings), device=None))


def _load(settings: Settings | EngineSettings):
    if settings.engine == "null":  # only when named: the validator knows no other spelling, the default is batchinfer
        return NullGenerator.from_settings(settings)
    if settings.engine == "batchinfer":
        from batchinfer.engine import LLMEngine  # lazy: torch

        return LLMEngine.from_pretrained(settings.model, str(settings.model_cache), engine_config(settings))
    from transformers.utils import logging as hf_logging  # lazy: transformers and torch, for the reference engine only

    from batchinfer.runtime.hf_generate import HFGenerator

    hf_logging.disable_progress_bar()  # our own progress bar tells the story
    return HFGenerator.from_pretrained(settings.model, str(settings.model_cache), engine_config(settings))
