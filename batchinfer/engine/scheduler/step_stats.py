"""Measured step times, split by phase: what the runtime turns into prefill and decode costs for estimates."""
from __future__ import annotations

from dataclasses import dataclass, field

from .sequence import Sequence

TOTALS = ("prefill_tokens", "prefill_s", "decode_steps", "decode_tokens", "decode_s", "decode_tokens_sq",
          "decode_token_s", "prefill_pairs", "prefill_tt", "prefill_tp", "prefill_pp", "prefill_ts", "prefill_ps",
          "decode_pairs")
SIZE_SUMS = 6  # per size class: steps, sum of b, sum of t, sum of pairs P, sum of P*P, sum of P*t


def size_class(batch: int) -> int:
    """Decode batches are measured in classes of powers of two: 1, 2, 4 (3-4), 8 (5-8), ..."""
    return 1 << (batch - 1).bit_length()


@dataclass
class StepStats:
    """Totals since the engine started. A step that computes any prompt token is a prefill step (decodes
    riding along included); the rest are decode steps, whose batch size b and time t are also summed as
    b*b and b*t, so a decode step's cost a + c*b can be fitted by least squares from the sums alone, and
    per class of batch size (by_size: class -> [steps, sum of b, sum of t, sum of P, sum of P*P, sum of P*t]),
    since the cost is not linear in b everywhere (int8 weights for small steps, one matmul kernel or another).

    Attention grows with the context each token attends to, so steps also count attention pairs P (query
    token, key): a prompt token at position i attends to i + 1 keys, a decode row to its whole sequence. Per
    prefill step the sums of t*t, t*P, P*P, t*s, P*s (t: prompt tokens, s: seconds) let prefill_s = a*t + p*P
    be fitted by least squares from the sums alone; per size class the P sums give a slope within the class."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0  # the sum of b
    decode_s: float = 0.0  # the sum of t
    decode_tokens_sq: int = 0  # the sum of b*b
    decode_token_s: float = 0.0  # the sum of b*t
    prefill_pairs: int = 0  # the sum of P over prefill steps
    prefill_tt: float = 0.0  # sums over prefill steps for the fit of s = a*t + p*P
    prefill_tp: float = 0.0
    prefill_pp: float = 0.0
    prefill_ts: float = 0.0
    prefill_ps: float = 0.0
    decode_pairs: int = 0  # the sum of P over decode steps
    by_size: dict[int, list[float]] = field(default_factory=dict)

    @staticmethod
    def prompt_tokens(seqs: list[Sequence]) -> int:
        """The prompt tokens a scheduled step computes (read before the step moves the sequences on)."""
        return sum(max(0, min(s.num_prompt_tokens - s.num_computed_tokens, s.num_new_tokens)) for s in seqs)

    @staticmethod
    def pairs(seqs: list[Sequence]) -> int:
        """Attention pairs of a scheduled step's prompt tokens, or of its decode rows when it computes none
        (read before the step moves the sequences on): the tokens at positions [c, c+n) attend to
        n*c + n(n+1)/2 keys; a decode row's one token to the whole sequence."""
        total = 0
        for s in seqs:
            c, n = s.num_computed_tokens, max(0, min(s.num_prompt_tokens - s.num_computed_tokens, s.num_new_tokens))
            total += n * c + n * (n + 1) // 2
        return total or sum(len(s) for s in seqs)

    def record(self, seqs: list[Sequence], seconds: float, prompt: int | None = None,
               pairs: int | None = None) -> None:
        if prompt is None:
            prompt, pairs = self.prompt_tokens(seqs), self.pairs(seqs)
        p = pairs or 0
        if prompt:
            self.prefill_tokens += prompt
            self.prefill_s += seconds
            self.prefill_pairs += p
            self.prefill_tt += prompt * prompt
            self.prefill_tp += prompt * p
            self.prefill_pp += p * p
            self.prefill_ts += prompt * seconds
            self.prefill_ps += p * seconds
            return
        b = len(seqs)
        self.decode_steps += 1
        self.decode_tokens += b
        self.decode_s += seconds
        self.decode_tokens_sq += b * b
        self.decode_token_s += b * seconds
        self.decode_pairs += p
        sums = self.by_size.setdefault(size_class(b), [0.0] * SIZE_SUMS)
        for i, v in enumerate((1, b, seconds, p, p * p, p * seconds)):
            sums[i] += v

    def since(self, before: StepStats) -> StepStats:
        out = StepStats(*(getattr(self, n) - getattr(before, n) for n in TOTALS))
        for size, now in self.by_size.items():
            then = before.by_size.get(size, [0.0] * SIZE_SUMS)
            if now[0] > then[0]:
                out.by_size[size] = [a - b for a, b in zip(now, then)]
        return out

    def copy(self) -> StepStats:
        out = StepStats(*(getattr(self, n) for n in TOTALS))
        out.by_size = {size: list(sums) for size, sums in self.by_size.items()}
        return out
