"""What run_unit needs from a generator: the engine (LLMEngine) and the transformers reference (HFGenerator)
both fit it."""
from __future__ import annotations

from typing import Callable, Collection, Iterable, Protocol, runtime_checkable

from batchinfer.engine.types import GenerationRequest, GenerationResult


class Generator(Protocol):
    def generate(self, requests: Iterable[GenerationRequest],
                 on_result: Callable[[GenerationResult], None] | None = None,
                 aborts: Callable[[], Collection[str]] | None = None) -> list[GenerationResult]:
        """Run every request to completion; on_result sees each as it finishes; the list keeps input order.
        A result may carry an `error` attribute: that request failed alone. aborts() is asked often (each
        engine step) and names requests to stop at once: they end with finish_reason "abort", their KV freed."""
        ...


@runtime_checkable
class CheckingGenerator(Generator, Protocol):
    def check_request(self, req: GenerationRequest) -> None:
        """Raise ValueError when the generator can never run this request (checked before a batch runs)."""
        ...
