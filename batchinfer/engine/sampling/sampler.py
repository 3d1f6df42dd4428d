"""Token sampling: greedy, temperature, top-k, top-p, as one batched draw on the device.

The draw is an exponential race (argmax of p / Exp(1)), one noise value per vocabulary entry. Unseeded
rows share one batched noise tensor; a row that asked for a seed draws its noise from its own
torch.Generator, so a seed gives the same tokens whatever else shares the batch.
"""
from __future__ import annotations

import torch

from ..types import SamplingParams


class Sampler:
    def __init__(self):
        self._generators: dict[str, torch.Generator] = {}

    def add(self, request_id: str, params: SamplingParams, device: torch.device | str = "cpu") -> None:
        if params.greedy or params.seed is None:
            return
        gen = torch.Generator(device=device)
        gen.manual_seed(params.seed)
        self._generators[request_id] = gen

    def remove(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> list[int]:
        """logits [n, vocab] float32, one row per request -> one token id per request."""
        tokens = logits.max(dim=-1).indices  # argmax's answer (the first of equal maxima) at 1/3 of its CPU time
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            picked = self._sample_rows(logits[rows], [request_ids[i] for i in rows], [params[i] for i in rows])
            tokens[rows] = picked
        return tokens.tolist()

    def _sample_rows(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> torch.Tensor:
        temps = logits.new_tensor([p.temperature for p in params])
        probs = torch.softmax(_top_k(logits / temps[:, None], params), dim=-1)
        probs = _top_p(probs, params)
        noise = torch.empty_like(probs).exponential_(1)
        for row, rid in enumerate(request_ids):
            gen = self._generators.get(rid)
            if gen is not None:
                noise[row].exponential_(1, generator=gen)
        return probs.div_(noise.clamp_min_(1e-10)).argmax(dim=-1)


def _top_k(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    vocab = logits.shape[-1]
    ks = [min(p.top_k, vocab) for p in params]  # 0: no cut
    if not any(ks):
        return logits
    top = torch.topk(logits, max(ks), dim=-1).values  # sorted descending
    kth = top.gather(1, torch.tensor([max(k, 1) - 1 for k in ks], device=logits.device)[:, None])
    kth[torch.tensor([k == 0 for k in ks], device=logits.device)] = float("-inf")
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    top_ps = [p.top_p for p in params]
    if min(top_ps) >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # keep the smallest set reaching top_p: drop an entry when the mass before it already reaches top_p
    outside = sorted_probs.cumsum(-1) - sorted_probs > probs.new_tensor(top_ps)[:, None]
    return probs.scatter(1, order, sorted_probs.masked_fill(outside, 0.0))
