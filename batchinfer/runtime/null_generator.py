"""The null engine (BATCHINFER_ENGINE=null): answers every request at once with one token and loads no weights,
so a benchmark times the job system alone (`batchinfer bench pipeline`). Never the default: its outputs are
not a model's, so it runs only when asked for by name, and a worker running it says so in its log."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Collection, Iterable

from batchinfer.engine.types import EngineDescription, GenerationRequest, GenerationResult, refusal
from batchinfer.jobs.intake.tokenizer import tokenizer_and_context

if TYPE_CHECKING:  # pydantic: the engine process imports none
    from batchinfer.runtime.engine_host import EngineSettings
    from batchinfer.settings import Settings

log = logging.getLogger(__name__)


class NullGenerator:
    """The Generator contract (jobs.units.generator) with no model: the same refusals as the engine, aborts
    honoured, results in input order; every answer is the end-of-sequence token, finish_reason "length"."""

    description = EngineDescription("none", "the null engine runs no model")

    def __init__(self, tokenizer, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        eos = getattr(tokenizer, "eos_token_id", None)
        self.token_id = int(eos) if eos is not None else 0

    @classmethod
    def from_settings(cls, settings: Settings | EngineSettings) -> "NullGenerator":
        log.warning("BATCHINFER_ENGINE=null: every request is answered with one token and no model runs "
                    "(for benchmarking the job system only)")
        return cls(*tokenizer_and_context(settings))

    def generate(self, requests: Iterable[GenerationRequest],
                 on_result: Callable[[GenerationResult], None] | None = None,
                 aborts: Callable[[], Collection[str]] | None = None) -> list[GenerationResult]:
        requests = list(requests)
        stopped = set(aborts()) if aborts is not None else set()
        now = time.time()
        results = []
        for req in requests:
            if req.arrival_time is None:
                req.arrival_time = now
            result = self._answer(req, req.request_id in stopped, now)
            if on_result is not None:
                on_result(result)
            results.append(result)
        return results

    def _answer(self, req: GenerationRequest, aborted: bool, now: float) -> GenerationResult:
        problem = refusal(req, self.max_model_len) or ("the null engine computes no embeddings"
                                                       if req.sampling.embed else None)
        if problem:
            return GenerationResult.failed(req, problem)
        arrival = req.arrival_time if req.arrival_time is not None else now
        tokens, reason = ([], "abort") if aborted else ([self.token_id], "length")
        return GenerationResult(req.request_id, tokens, "", reason, len(req.prompt_token_ids), 0, arrival, now, now, now)
