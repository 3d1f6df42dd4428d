"""Measured step times, split by phase: what the runtime turns into prefill and decode rates for estimates."""
from __future__ import annotations

from dataclasses import dataclass

from .sequence import Sequence


@dataclass
class StepStats:
    """Totals since the engine started. A step that computes any prompt token is a prefill step (decodes
    riding along included); the rest are decode steps."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    decode_steps: int = 0

    def record(self, seqs: list[Sequence], seconds: float) -> None:
        prompt = sum(max(0, min(s.num_prompt_tokens - s.num_computed_tokens, s.num_new_tokens)) for s in seqs)
        if prompt:
            self.prefill_tokens += prompt
            self.prefill_s += seconds
        else:
            self.decode_tokens += len(seqs)
            self.decode_s += seconds
            self.decode_steps += 1

    def since(self, before: StepStats) -> StepStats:
        return StepStats(self.prefill_tokens - before.prefill_tokens, self.prefill_s - before.prefill_s,
                         self.decode_tokens - before.decode_tokens, self.decode_s - before.decode_s,
                         self.decode_steps - before.decode_steps)

    def copy(self) -> StepStats:
        return StepStats(self.prefill_tokens, self.prefill_s, self.decode_tokens, self.decode_s, self.decode_steps)
