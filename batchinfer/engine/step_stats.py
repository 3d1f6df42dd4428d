"""Measured step times, split by phase: what the runtime turns into prefill and decode costs for estimates."""
from __future__ import annotations

from dataclasses import dataclass, field

from .sequence import Sequence

TOTALS = ("prefill_tokens", "prefill_s", "decode_steps", "decode_tokens", "decode_s", "decode_tokens_sq",
          "decode_token_s")


def size_class(batch: int) -> int:
    """Decode batches are measured in classes of powers of two: 1, 2, 4 (3-4), 8 (5-8), ..."""
    return 1 << (batch - 1).bit_length()


@dataclass
class StepStats:
    """Totals since the engine started. A step that computes any prompt token is a prefill step (decodes
    riding along included); the rest are decode steps, whose batch size b and time t are also summed as
    b*b and b*t, so a decode step's cost a + c*b can be fitted by least squares from the sums alone, and
    per class of batch size (by_size: class -> [steps, sum of b, sum of t]), since the cost is not linear in
    b everywhere (int8 weights for small steps, one matmul kernel or another)."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0  # the sum of b
    decode_s: float = 0.0  # the sum of t
    decode_tokens_sq: int = 0  # the sum of b*b
    decode_token_s: float = 0.0  # the sum of b*t
    by_size: dict[int, list[float]] = field(default_factory=dict)

    @staticmethod
    def prompt_tokens(seqs: list[Sequence]) -> int:
        """The prompt tokens a scheduled step computes (read before the step moves the sequences on)."""
        return sum(max(0, min(s.num_prompt_tokens - s.num_computed_tokens, s.num_new_tokens)) for s in seqs)

    def record(self, seqs: list[Sequence], seconds: float, prompt: int | None = None) -> None:
        prompt = self.prompt_tokens(seqs) if prompt is None else prompt
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
        sums = self.by_size.setdefault(size_class(b), [0.0, 0.0, 0.0])
        sums[0] += 1
        sums[1] += b
        sums[2] += seconds

    def since(self, before: StepStats) -> StepStats:
        out = StepStats(*(getattr(self, n) - getattr(before, n) for n in TOTALS))
        for size, now in self.by_size.items():
            then = before.by_size.get(size, [0.0, 0.0, 0.0])
            if now[0] > then[0]:
                out.by_size[size] = [a - b for a, b in zip(now, then)]
        return out

    def copy(self) -> StepStats:
        out = StepStats(*(getattr(self, n) for n in TOTALS))
        out.by_size = {size: list(sums) for size, sums in self.by_size.items()}
        return out
