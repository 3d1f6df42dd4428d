"""A plain transformers generator with the engine's generate() contract: the reference path.

It runs one request at a time with the model's own KV cache, so it is slow but simple; LLMEngine is the
default and this is used when BATCHINFER_ENGINE=hf. Only the forward pass is transformers': tokens are
drawn by the engine's Sampler and stopped by its StopChecker, so both paths sample and stop alike.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Collection, Iterable

import torch

from batchinfer.engine.config import EngineConfig
from batchinfer.engine.llm_engine import aborted_result, eos_token_ids, sequence_result
from batchinfer.engine.loading.loader import LoadedModel, load_model
from batchinfer.engine.sampling.logits_processors import apply_logits_processors
from batchinfer.engine.sampling.logprobs import sampled_logprobs
from batchinfer.engine.scheduler.parallel_sampling import merge_samples, sample_requests
from batchinfer.engine.sampling.sampler import Sampler
from batchinfer.engine.scheduler.sequence import Sequence
from batchinfer.engine.sampling.stop_checker import StopChecker
from batchinfer.engine.types import EngineDescription, GenerationRequest, GenerationResult, context_length, refusal


class HFGenerator:
    def __init__(self, loaded: LoadedModel, description: EngineDescription = EngineDescription("float32")):
        # load_model's transformers model, called as a function (which the CausalLM protocol does not promise).
        self.model: Any = loaded.hf_model
        self.tokenizer = loaded.tokenizer
        self.max_model_len = context_length(loaded.config)
        self.sampler = Sampler()
        self.eos_token_ids = frozenset(eos_token_ids(loaded))
        self.stop_checker = StopChecker(loaded.tokenizer, self.eos_token_ids, self.max_model_len)
        self.description = description  # no weight format: transformers runs the dense model

    @classmethod
    def from_pretrained(cls, model_path: str | None, cache_dir: str, config: EngineConfig | None = None) -> "HFGenerator":
        """In the engine config's dtype (float32 without one), as the engine would run."""
        config = config or EngineConfig(dtype="float32")
        return cls(load_model(model_path, cache_dir, config.torch_dtype), EngineDescription(config.dtype, config.dtype_reason))

    def generate(self, requests: Iterable[GenerationRequest],
                 on_result: Callable[[GenerationResult], None] | None = None,
                 aborts: Callable[[], Collection[str]] | None = None) -> list[GenerationResult]:
        requests = list(requests)
        stopped: set[str] = set()

        def aborted(request_id: str) -> bool:  # asked before every token, as LLMEngine asks before every step
            stopped.update(aborts() if aborts is not None else ())
            return request_id in stopped

        now = time.time()
        for req in requests:
            if req.arrival_time is None:
                req.arrival_time = now
        results = []
        for req in requests:
            problem = refusal(req, self.max_model_len) or (  # no silent base answers for an adapter's line
                f"request {req.request_id}: the transformers reference engine (BATCHINFER_ENGINE=hf) runs no LoRA "
                "adapters" if req.lora_request is not None else None)
            result = GenerationResult.failed(req, problem) if problem else self._generate_samples(req, aborted)
            if on_result:
                on_result(result)
            results.append(result)
        return results

    def _generate_samples(self, req: GenerationRequest, aborted: Callable[[str], bool]) -> GenerationResult:
        """n > 1: each sample as a request of its own, with the seed the engine gives it (no prompt sharing here)."""
        if req.sampling.n == 1:
            return self._generate_one(req, aborted)
        samples = [self._generate_one(r, lambda _: aborted(req.request_id)) for r in sample_requests(req)]
        return merge_samples(req, samples, 0)

    @torch.inference_mode()
    def _generate_one(self, req: GenerationRequest, aborted: Callable[[str], bool]) -> GenerationResult:
        if req.sampling.embed:
            return GenerationResult.failed(req, "embeddings need the engine backend")
        seq = Sequence(req.request_id, req.prompt_token_ids, req.sampling, req.arrival_time or time.time())
        if aborted(seq.request_id):
            seq.finish_reason = "abort"
            return aborted_result(seq, self.stop_checker)
        seq.first_scheduled_time = time.time()
        self.sampler.add(seq.request_id, seq.sampling)
        try:
            out = self.model(input_ids=torch.tensor([req.prompt_token_ids]), use_cache=True)
            while True:
                seq.token_ids.append(self._sample(out.logits[:, -1].float(), seq))
                seq.last_token_time = time.time()
                seq.first_token_time = seq.first_token_time or seq.last_token_time
                seq.finish_reason = self.stop_checker(seq)
                if seq.finish_reason is not None:
                    return sequence_result(seq, self.stop_checker)
                if aborted(seq.request_id):
                    seq.finish_reason = "abort"
                    return aborted_result(seq, self.stop_checker)
                out = self.model(input_ids=torch.tensor([seq.token_ids[-1:]]), use_cache=True, **_cache_kwargs(out))
        finally:
            self.sampler.remove(seq.request_id)

    def _sample(self, logits: torch.Tensor, seq: Sequence) -> int:
        """As the engine's runner: penalties and masks, the draw, then the logprobs from the same logits."""
        logits = apply_logits_processors(logits, [seq], self.eos_token_ids)
        token = self.sampler.sample(logits, [seq.request_id], [seq.sampling])[0]
        seq.logprobs.extend(sampled_logprobs(logits, [seq], [token]).values())
        return token


def _cache_kwargs(out) -> dict:
    # transformers 5 renamed past_key_values to cache; older versions only know the first name.
    return {"cache": out["cache"]} if "cache" in out else {"past_key_values": out.past_key_values}
