"""A plain transformers generator with the engine's generate() contract: the reference path.

It runs one request at a time with the model's own KV cache, so it is slow but simple; LLMEngine is the
default and this is used when BATCHINFER_ENGINE=hf or the engine cannot be imported.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch

from batchinfer.engine.loader import LoadedModel, load_model
from batchinfer.engine.types import GenerationRequest, GenerationResult, SamplingParams


class HFGenerator:
    def __init__(self, loaded: LoadedModel):
        # load_model's transformers model, called as a function (which the CausalLM protocol does not promise).
        self.model: Any = loaded.hf_model
        self.tokenizer = loaded.tokenizer
        self.max_model_len = int(getattr(loaded.config, "max_position_embeddings", 8192))
        self.eos_ids = {loaded.tokenizer.eos_token_id, getattr(loaded.config, "eos_token_id", None)} - {None}

    @classmethod
    def from_pretrained(cls, model_path: str | None, cache_dir: str) -> "HFGenerator":
        return cls(load_model(model_path, cache_dir))

    def generate(self, requests: Iterable[GenerationRequest],
                 on_result: Callable[[GenerationResult], None] | None = None) -> list[GenerationResult]:
        requests = list(requests)
        now = time.time()
        for req in requests:
            if req.arrival_time is None:
                req.arrival_time = now
        results = []
        for req in requests:
            result = self._generate_one(req)
            if on_result:
                on_result(result)
            results.append(result)
        return results

    @torch.inference_mode()
    def _generate_one(self, req: GenerationRequest) -> GenerationResult:
        sp = req.sampling
        generator = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
        scheduled = time.time()
        ids = torch.tensor([req.prompt_token_ids])
        out = self.model(input_ids=ids, use_cache=True)
        tokens: list[int] = []
        first = last = scheduled
        finish = "length"
        text = ""
        while True:
            token = _sample(out.logits[0, -1], sp, generator)
            last = time.time()
            if not tokens:
                first = last
            if token in self.eos_ids and not sp.ignore_eos:
                finish = "stop"
                break
            tokens.append(token)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            cut = _stop_cut(text, sp.stop)
            if cut is not None:
                text, finish = text[:cut], "stop"
                break
            if len(tokens) >= sp.max_tokens:
                break
            out = self.model(input_ids=torch.tensor([[token]]), use_cache=True, **_cache_kwargs(out))
        assert req.arrival_time is not None, "generate() stamps every request"
        return GenerationResult(req.request_id, tokens, text, finish, len(req.prompt_token_ids), 0,
                                req.arrival_time, scheduled, first, last)


def _cache_kwargs(out) -> dict:
    # transformers 5 renamed past_key_values to cache; older versions only know the first name.
    return {"cache": out["cache"]} if "cache" in out else {"past_key_values": out.past_key_values}


def _stop_cut(text: str, stops: tuple[str, ...]) -> int | None:
    found = [text.find(s) for s in stops if s in text]
    return min(found) if found else None


def _sample(logits: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None) -> int:
    if sp.greedy:
        return int(torch.argmax(logits))
    logits = logits.float() / sp.temperature
    if sp.top_k > 0:
        kth = torch.topk(logits, min(sp.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sp.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < sp.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
