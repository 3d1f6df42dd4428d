"""A Generator whose engine runs in the engine process (engine_process.py): the unit runner in `batchinfer run`
uses it as it would the engine itself."""
from __future__ import annotations

import sys
from typing import Callable, Collection, Iterable

from batchinfer.engine.sampling.stop_checker import decoded_text
from batchinfer.engine.types import GenerationRequest, GenerationResult
from batchinfer.jobs.intake.tokenizer import tokenizer_and_context
from batchinfer.runtime import engine_messages as msg

POLL_S = 0.05  # how often aborts() is asked while the engine runs (the engine asks it each step)


class RemoteGenerator:
    def __init__(self, process, loaded: msg.Loaded):
        self.process = process
        self.description = loaded.description
        self._has_step_stats = loaded.has_step_stats
        sys.stderr.write(loaded.notes)  # the dtype and weights lines, as get_generator prints them

    def __getattr__(self, name: str):
        if name == "step_stats" and self._has_step_stats:  # a snapshot: the unit runner takes differences
            self.process.send(msg.AskStepStats())
            return self.process.recv()
        raise AttributeError(name)

    def generate(self, requests: Iterable[GenerationRequest],
                 on_result: Callable[[GenerationResult], None] | None = None,
                 aborts: Callable[[], Collection[str]] | None = None) -> list[GenerationResult]:
        self.process.send(msg.Generate(list(requests)))
        sent: set[str] = set()
        while True:
            if aborts is not None and (new := set(aborts()) - sent):
                self.process.send(msg.Abort(frozenset(new)))
                sent |= new
            reply = self.process.recv(POLL_S if aborts is not None else None)
            if isinstance(reply, msg.Result):
                if on_result is not None:
                    on_result(self._decoded(reply.result))
            elif isinstance(reply, msg.Returned):
                return [self._decoded(r) for r in reply.results]
            elif isinstance(reply, msg.Failed):
                raise reply.exception()

    def _decoded(self, result: GenerationResult) -> GenerationResult:
        """The text the engine process left to this one (EngineConfig.detokenize), decoded with the tokenizer
        validation loaded from the same model files."""
        for sample in result.samples or ():
            self._decoded(sample)
        if result.text_pending:
            if result.samples:  # sample 0's fields, as merge_samples made them
                result.text = result.samples[0].text
            else:
                tokenizer = tokenizer_and_context(self.process.settings)[0]
                result.text = decoded_text(lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                                           result.output_token_ids, result.finish_reason)
            result.text_pending = False
        return result
