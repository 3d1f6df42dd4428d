"""n samples of one prompt (OpenAI's `n`, vLLM's parallel sampling): the prompt is prefilled once, then forked.

A PromptSequence computes the K/V of every prompt token but the last and never samples. When it is done, its
n sample sequences fork its blocks (BlockManager.fork: by reference; the partial last block is copied on first
write) and each runs the last prompt token itself. So sample i draws exactly the tokens a lone request with
seed sample_seed(seed, i) draws, whatever runs beside it, and a rerun gives the same n samples.
"""
from __future__ import annotations

import hashlib
from dataclasses import replace

from .sequence import Sequence
from ..types import GenerationRequest, GenerationResult


def sample_seed(seed: int | None, index: int) -> int | None:
    """Sample 0 keeps the request's seed (n=1 and sample 0 agree); sample i > 0 a 64-bit hash of (seed, i)."""
    if seed is None or index == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest(), "little")


def sample_id(request_id: str, index: int) -> str:
    return f"{request_id}#sample{index}"


def sample_requests(req: GenerationRequest) -> list[GenerationRequest]:
    """The n one-sample requests of req, sample i with its own seed (what a generator that cannot fork runs)."""
    return [GenerationRequest(sample_id(req.request_id, i), list(req.prompt_token_ids),
                              replace(req.sampling, n=1, seed=sample_seed(req.sampling.seed, i)),
                              req.arrival_time, req.cache_salt, req.lora_request)
            for i in range(req.sampling.n)]


def merge_samples(req: GenerationRequest, samples: list[GenerationResult], cached_tokens: int) -> GenerationResult:
    """One result for the request: sample 0's fields, every sample in `samples`, the prompt counted once."""
    first = samples[0]
    error = next((s.error for s in samples if s.error), None)
    reason = "error" if error else "abort" if any(s.aborted for s in samples) else first.finish_reason
    return replace(first, request_id=req.request_id, finish_reason=reason, error=error,
                   prompt_tokens=len(req.prompt_token_ids), cached_tokens=cached_tokens,
                   first_scheduled_time=min(s.first_scheduled_time for s in samples),
                   first_token_time=min(s.first_token_time for s in samples),
                   last_token_time=max(s.last_token_time for s in samples), samples=samples)


class PromptSequence(Sequence):
    """The shared prompt of an n-sample request, but its last token: computed once, never sampled."""

    def __init__(self, *args, num_samples: int, parent_id: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.num_samples = num_samples  # the scheduler admits it only where its samples fit max_num_seqs
        self.parent_id = parent_id  # the request whose samples fork it

    def samples_this_step(self) -> bool:
        return False

    @property
    def prefilled(self) -> bool:
        return self.num_computed_tokens == len(self.token_ids)


class ParentRequest:
    """Where an n-sample request stands: its prompt sequence (None for a one-token prompt: nothing to share),
    its sample sequences, and the results of the samples that finished."""

    def __init__(self, req: GenerationRequest, samples: list[Sequence], prompt: PromptSequence | None):
        self.request = req
        self.samples = samples
        self.prompt = prompt
        self.results: dict[str, GenerationResult] = {}

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.samples)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served: the prompt sequence's, or sample 0's without one."""
        source = self.prompt if self.prompt is not None else self.samples[0]
        return source.num_cached_tokens or 0

    def result(self) -> GenerationResult:
        return merge_samples(self.request, [self.results[s.request_id] for s in self.samples], self.cached_tokens)
