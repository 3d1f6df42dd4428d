"""Penalties, biases and masks on the logits before sampling, batched on the device, for the rows that ask.

Every operation is per row (a row's result never depends on another row). Definitions:
- presence / frequency penalty (OpenAI): logit - presence * [count > 0] - frequency * count, counts over the output;
- repetition penalty (vLLM): a token seen in the prompt or the output has its logit divided by the penalty
  when positive, multiplied when negative;
- logit_bias: added to the logit of each listed token id;
- min_tokens: EOS and stop_token_ids masked to -inf until that many tokens are out (unless ignore_eos).
"""
from __future__ import annotations

import torch

from ..scheduler.sequence import Sequence


def apply_logits_processors(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int]) -> torch.Tensor:
    """logits [n, vocab] float32, one row per sequence; rows that ask nothing are left untouched."""
    rows = [i for i, s in enumerate(seqs) if s.sampling.penalized]
    if not rows:
        return logits
    picked = [seqs[i] for i in rows]
    index = torch.tensor(rows, device=logits.device)
    sub = logits.index_select(0, index)
    sub = _penalize(sub, picked)
    sub = _bias(sub, picked)
    sub = _min_tokens(sub, picked, eos_token_ids)
    return logits.index_copy(0, index, sub)


def _token_matrix(lists: list[list[int]], device: torch.device) -> torch.Tensor:
    """The lists padded into one [n, width] tensor; -1 pads (dropped by the callers' masks)."""
    width = max((len(t) for t in lists), default=0) or 1
    return torch.tensor([t + [-1] * (width - len(t)) for t in lists], dtype=torch.int64, device=device)


def _counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, width] ids (-1 pads) -> [n, vocab] float counts."""
    valid = tokens >= 0
    counts = torch.zeros(tokens.shape[0], vocab + 1, device=tokens.device)
    counts.scatter_add_(1, torch.where(valid, tokens, vocab), valid.float())
    return counts[:, :vocab]


def _penalize(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    params = [s.sampling for s in seqs]
    vocab = logits.shape[1]
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        out = _counts(_token_matrix([s.output_token_ids for s in seqs], logits.device), vocab)
        presence = logits.new_tensor([p.presence_penalty for p in params])[:, None]
        frequency = logits.new_tensor([p.frequency_penalty for p in params])[:, None]
        logits = logits - presence * (out > 0) - frequency * out
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = _counts(_token_matrix([s.token_ids for s in seqs], logits.device), vocab) > 0
        penalty = logits.new_tensor([p.repetition_penalty for p in params])[:, None].expand_as(logits)
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, scaled, logits)
    return logits


def _bias(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    entries = [(row, tok, bias) for row, s in enumerate(seqs) for tok, bias in s.sampling.logit_bias.items()
               if 0 <= tok < logits.shape[1]]
    if not entries:
        return logits
    rows, toks, biases = zip(*entries)
    bias = torch.zeros_like(logits)
    bias[torch.tensor(rows, device=logits.device), torch.tensor(toks, device=logits.device)] = logits.new_tensor(biases)
    return logits + bias


def _min_tokens(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int]) -> torch.Tensor:
    masked = [(row, tok) for row, s in enumerate(seqs) if s.num_output_tokens < s.sampling.min_tokens
              for tok in set(s.sampling.stop_token_ids) | (set() if s.sampling.ignore_eos else eos_token_ids)
              if 0 <= tok < logits.shape[1]]
    if not masked:
        return logits
    rows, toks = zip(*masked)
    logits = logits.clone()
    logits[torch.tensor(rows, device=logits.device), torch.tensor(toks, device=logits.device)] = float("-inf")
    return logits
