"""bf16 checked the vLLM way (check_logprobs_close) against transformers fp32 greedy output.

On every test prompt, at the first position where the greedy tokens differ, each side's token must be
in the other's top 5. The exact-match rate is printed (pytest -s) for the record.
"""
from __future__ import annotations

import torch

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.sampler import Sampler

MAX_NEW_TOKENS = 12  # as conftest.MAX_NEW_TOKENS, the length of hf_reference

TOP = 5


class LogitsRecorder(Sampler):
    """The engine's own sampler, keeping the last step's logits so the test can read the top 5."""

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


def test_bf16_greedy_is_close_to_transformers_fp32(loaded_model, prompt_token_ids, hf_reference):
    engine = LLMEngine(loaded_model, EngineConfig(dtype="bfloat16", max_num_seqs=32))
    assert engine.runner.model.embed.dtype == torch.bfloat16
    engine.runner.sampler = LogitsRecorder()
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
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
    print(f"\nbf16 exact match with transformers fp32: {exact}/{len(results)} prompts "
          f"({MAX_NEW_TOKENS} greedy tokens each)")
    assert not problems, problems
