"""Token sampling: greedy, temperature, top-k, top-p, each request with its own seeded generator.

Random draws come from a per-request torch.Generator, one draw per sampled token, so a seed gives
the same tokens whatever else shares the batch.
"""
from __future__ import annotations

import torch

from .types import SamplingParams


class Sampler:
    def __init__(self):
        self._generators: dict[str, torch.Generator] = {}

    def add(self, request_id: str, params: SamplingParams) -> None:
        if params.greedy:
            return
        gen = torch.Generator()
        if params.seed is not None:
            gen.manual_seed(params.seed)
        else:
            gen.seed()
        self._generators[request_id] = gen

    def remove(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> list[int]:
        """logits [n, vocab] float32, one row per request -> one token id per request."""
        tokens = logits.argmax(dim=-1).tolist()
        for row, (rid, p) in enumerate(zip(request_ids, params)):
            if not p.greedy:
                tokens[row] = self._sample_row(logits[row], p, self._generators[rid])
        return tokens

    @staticmethod
    def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
        logits = logits.cpu() / p.temperature
        if p.top_k:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(0) - sorted_probs > p.top_p  # keep the smallest set reaching top_p
            probs = probs.scatter(0, order, sorted_probs.masked_fill(outside, 0.0))
        # Exponential race (argmax of p / Exp(1)) draws from probs with exactly one draw per token.
        noise = torch.empty_like(probs).exponential_(generator=gen)
        return int((probs / noise).argmax())
