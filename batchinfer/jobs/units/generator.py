"""What run_unit needs from a generator: the engine (LLMEngine) and the transformers reference (HFGenerator)
both fit it."""
from __future__ import annotations

from typing import Callable, Collection, Iterable, Protocol

from batchinfer.engine.types import EngineDescription, GenerationRequest, GenerationResult


class Generator(Protocol):
    description: EngineDescription  # what it runs (dtype, weight format, activations), recorded with each output

    def generate(self, requests: Iterable[GenerationRequest],
                 on_result: Callable[[GenerationResult], None] | None = None,
                 aborts: Callable[[], Collection[str]] | None = None) -> list[GenerationResult]:
        """Run every request to completion; on_result sees each as it finishes; the list keeps input order.
        A request the generator can never run (engine.types.refusal) gets a result with `error` set: it
        fails alone, the rest of the batch runs. aborts() is asked often (each engine step) and names requests
        to stop at once: they end with finish_reason "abort", their KV freed."""
        ...

