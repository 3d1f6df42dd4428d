"""vLLM's check_logprobs_close on greedy output against transformers fp32 (hf_reference): on every prompt, at the
first position where the greedy tokens differ, each side's token must be in the other's top 5. Shared by the
bf16 and the quantized-weights fidelity tests."""
from __future__ import annotations

import torch

from batchinfer.engine import GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.sampling.sampler import Sampler

TOP = 5


class LogitsRecorder(Sampler):
    """The engine's own sampler, keeping the last step's logits so the check can read the top 5."""

    def sample(self, logits, request_ids, params):
        self.last = dict(zip(request_ids, logits.float().cpu()))
        return super().sample(logits, request_ids, params)


def _hf_top(loaded_model, ids: list[int]) -> list[int]:
    with torch.inference_mode():
        logits = loaded_model.hf_model(torch.tensor([ids])).logits[0, -1]
    return torch.topk(logits, TOP).indices.tolist()


def _engine_top(engine: LLMEngine, ids: list[int], rid: str) -> list[int]:
    engine.generate([GenerationRequest(rid, ids, SamplingParams(max_tokens=1, temperature=0))])
    return torch.topk(engine.runner.sampler.last[rid], TOP).indices.tolist()


def greedy_closeness(engine: LLMEngine, loaded_model, prompt_token_ids, hf_reference,
                     max_new_tokens: int) -> tuple[int, list]:
    """(prompts identical to the reference, the divergences outside the rule). The engine's sampler must be a
    LogitsRecorder."""
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0, ignore_eos=True)
    results = engine.generate([GenerationRequest(f"p{i}", ids, params) for i, ids in enumerate(prompt_token_ids)])
    exact, problems = 0, []
    for i, (ids, ref, res) in enumerate(zip(prompt_token_ids, hf_reference, results)):
        ours, theirs = res.output_token_ids, ref.tokens[:len(res.output_token_ids)]
        first = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if first is None:
            exact += 1
            continue
        context = ids + theirs[:first]
        hf_top, our_top = _hf_top(loaded_model, context), _engine_top(engine, context, f"top{i}")
        if ours[first] not in hf_top or theirs[first] not in our_top:
            problems.append((i, first, ours[first], hf_top, theirs[first], our_top))
    return exact, problems
