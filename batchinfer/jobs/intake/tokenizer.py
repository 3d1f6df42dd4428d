"""The tokenizer and context length that validation needs, without loading the model's weights."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from batchinfer.engine.loading.loader import Tokenizer, model_files_dir
from batchinfer.engine.types import context_length

if TYPE_CHECKING:  # pydantic: the engine process remembers its tokenizer here and imports none
    from batchinfer.settings import Settings


class ModelNamed(Protocol):
    """Settings, or the plain EngineSettings the engine process is sent (batchinfer/runtime/engine_host.py)."""
    @property
    def model(self) -> str | None: ...

    @property
    def model_cache(self) -> Path | str: ...

# Tokenizers of models this process has loaded (a worker, `batchinfer run`): validation reuses them.
_loaded: dict[tuple, tuple] = {}


def remember_tokenizer(settings: ModelNamed, tokenizer, max_model_len: int) -> None:
    _loaded[(settings.model, str(settings.model_cache))] = (tokenizer, max_model_len)


class _LazyTokenizer:
    """Loads the tokenizer (tokenizers + jinja2; transformers only without a tokenizer.json) on first use:
    a file that fails early never pays for it."""

    def __init__(self, folder: Path):
        self._folder = folder
        self._tokenizer: Tokenizer | None = None

    def __getattr__(self, name: str):
        return getattr(self._load(), name)

    def __len__(self) -> int:  # len() looks on the type, past __getattr__
        return len(self._load())

    def _load(self):
        if self._tokenizer is None:
            if (self._folder / "tokenizer.json").exists():
                from batchinfer.engine.loading.light_loader import light_tokenizer  # lazy: tokenizers and jinja2, loaded on a file's first line

                self._tokenizer = light_tokenizer(self._folder)
            else:
                from batchinfer.engine.loading.loader import transformers_tokenizer  # lazy: transformers, for a model without a tokenizer.json

                self._tokenizer = transformers_tokenizer(self._folder)
        return self._tokenizer


@lru_cache(maxsize=4)
def _tokenizer_and_len(model: str | None, cache_dir: str):
    folder = model_files_dir(model, cache_dir)
    config = json.loads((folder / "config.json").read_text())
    return _LazyTokenizer(folder), context_length(config)


SAMPLING_DEFAULTS = {"temperature": (float, lambda v: v >= 0), "top_p": (float, lambda v: 0 < v <= 1),
                     "top_k": (int, lambda v: v >= -1), "repetition_penalty": (float, lambda v: v > 0)}


@lru_cache(maxsize=16)
def _sampling_defaults(model: str | None, cache_dir: str) -> tuple[tuple[str, float | int], ...]:
    path = model_files_dir(model, cache_dir) / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    found = []
    for name, (kind, ok) in SAMPLING_DEFAULTS.items():
        value = config.get(name)
        # a value out of range (or of another type) is left out: the line's own default holds
        if isinstance(value, (int, float)) and not isinstance(value, bool) and ok(value) and (kind is float or value == int(value)):
            found.append((name, kind(value)))
    return tuple(found)


def sampling_defaults(settings: Settings) -> dict:
    """The sampling a line leaves unset gets from the checkpoint's generation_config.json (vLLM's
    `--generation-config auto`): temperature, top_p, top_k, repetition_penalty, where it sets them."""
    return dict(_sampling_defaults(settings.model, str(settings.model_cache)))


def tokenizer_and_context(settings: ModelNamed):
    """The tokenizer and context length for validation, without loading the weights when no model is loaded."""
    loaded = _loaded.get((settings.model, str(settings.model_cache)))
    if loaded is not None:
        return loaded
    return _tokenizer_and_len(settings.model, str(settings.model_cache))
