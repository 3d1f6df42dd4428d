"""bf16 checked the vLLM way (check_logprobs_close) against transformers fp32 greedy output.

On every test prompt, at the first position where the greedy tokens differ, each side's token must be
in the other's top 5. The exact-match rate is printed (pytest -s) for the record.
"""
from __future__ import annotations

import torch

from greedy_closeness import LogitsRecorder, greedy_closeness

from batchinfer.engine import EngineConfig, LLMEngine

MAX_NEW_TOKENS = 12  # as conftest.MAX_NEW_TOKENS, the length of hf_reference


def test_bf16_greedy_is_close_to_transformers_fp32(loaded_model, prompt_token_ids, hf_reference):
    engine = LLMEngine(loaded_model, EngineConfig(dtype="bfloat16", max_num_seqs=32))
    assert engine.runner.model.embed.dtype == torch.bfloat16
    engine.runner.sampler = LogitsRecorder()
    exact, problems = greedy_closeness(engine, loaded_model, prompt_token_ids, hf_reference, MAX_NEW_TOKENS)
    print(f"\nbf16 exact match with transformers fp32: {exact}/{len(prompt_token_ids)} prompts "
          f"({MAX_NEW_TOKENS} greedy tokens each)")
    assert not problems, problems
