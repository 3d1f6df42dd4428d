"""Logprobs of the sampled tokens, from the logits the sampler drew from (after penalties, biases and masks,
before temperature and top-k/top-p), in float32 whatever the model's dtype; computed only for rows that ask."""
from __future__ import annotations

import torch

from ..scheduler.sequence import Sequence
from ..types import TokenLogprob

MAX_TOP_LOGPROBS = 20


def sampled_logprobs(logits: torch.Tensor, seqs: list[Sequence], tokens: list[int]) -> dict[int, TokenLogprob]:
    """logits [n, vocab], one row per sequence -> TokenLogprob by row, for the rows whose request asked."""
    rows = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
    if not rows:
        return {}
    index = torch.tensor(rows, device=logits.device)
    logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor([[tokens[i]] for i in rows], device=logits.device))[:, 0].tolist()
    k = max(seqs[i].sampling.logprobs or 0 for i in rows)
    top_vals, top_ids = (logprobs.topk(min(k, logprobs.shape[1]), dim=-1) if k else (None, None))
    found = {}
    for j, i in enumerate(rows):
        want = seqs[i].sampling.logprobs or 0
        top: tuple[tuple[int, float], ...] = ()
        if want:
            assert top_vals is not None and top_ids is not None
            top = tuple(zip(top_ids[j, :want].tolist(), top_vals[j, :want].tolist()))
        found[i] = TokenLogprob(tokens[i], chosen[j], top)
    return found
