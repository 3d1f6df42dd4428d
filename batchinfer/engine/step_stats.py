"""Measured step times, split by phase: what the runtime turns into prefill and decode costs for estimates."""
from __future__ import annotations

from dataclasses import astuple, dataclass

from .sequence import Sequence


@dataclass
class StepStats:
    """Totals since the engine started. A step that computes any prompt token is a prefill step (decodes
    riding along included); the rest are decode steps, whose batch size b and time t are also summed as
    b*b and b*t, so a decode step's cost a + c*b can be fitted by least squares from the sums alone."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0  # the sum of b
    decode_s: float = 0.0  # the sum of t
    decode_tokens_sq: int = 0  # the sum of b*b
    decode_token_s: float = 0.0  # the sum of b*t

    def record(self, seqs: list[Sequence], seconds: float) -> None:
        prompt = sum(max(0, min(s.num_prompt_tokens - s.num_computed_tokens, s.num_new_tokens)) for s in seqs)
        if prompt:
            self.prefill_tokens += prompt
            self.prefill_s += seconds
            return
        b = len(seqs)
        self.decode_steps += 1
        self.decode_tokens += b
        self.decode_s += seconds
        self.decode_tokens_sq += b * b
        self.decode_token_s += b * seconds

    def since(self, before: StepStats) -> StepStats:
        return StepStats(*(now - then for now, then in zip(astuple(self), astuple(before))))

    def copy(self) -> StepStats:
        return StepStats(*astuple(self))
