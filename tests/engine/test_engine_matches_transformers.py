"""Greedy engine output equals transformers generate() token for token with dense weights (the GGUF's own blocks
run llama.cpp's int8-activation arithmetic instead: test_gguf_model.py checks them the vLLM way)."""
from __future__ import annotations

import pytest

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams

MAX_NEW_TOKENS = 12  # must equal conftest.MAX_NEW_TOKENS (the reference's length)
# A divergence is only accepted where transformers' own top-2 logits were this close (fp32 noise).
TOP2_TOLERANCE = 1e-2


def _requests(prompt_token_ids, tag: str) -> list[GenerationRequest]:
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0)
    return [GenerationRequest(f"{tag}-{i}", ids, params) for i, ids in enumerate(prompt_token_ids)]


def assert_matches_reference(results, references) -> list[str]:
    """Token-for-token equality up to the first divergence, which must sit on a near-tie in HF's logits."""
    accepted = []
    for res, ref in zip(results, references):
        got, want = res.output_token_ids, ref.tokens
        step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if step is None:
            assert len(got) == len(want), f"{res.request_id}: {got} vs transformers {want}"
            continue
        gap = ref.top2_gaps[step]
        assert gap < TOP2_TOLERANCE, (f"{res.request_id} diverges at step {step} where transformers' top-2 logit gap "
                                      f"is {gap:.4f} >= {TOP2_TOLERANCE}: {got} vs {want}")
        accepted.append(f"{res.request_id}@{step} (gap {gap:.2e})")
    print("accepted near-tie divergences:", accepted or "none")
    return accepted


@pytest.fixture(scope="module")
def engine_for(loaded_model):
    def make(**overrides) -> LLMEngine:
        return LLMEngine(loaded_model, EngineConfig(**overrides))
    return make


def test_prompts_cover_mixed_lengths_and_shared_prefixes(prompt_token_ids):
    lengths = sorted(len(p) for p in prompt_token_ids)
    assert len(prompt_token_ids) >= 24
    assert lengths[0] < 40 and lengths[-1] > 150


def test_greedy_matches_transformers_one_sequence_at_a_time(engine_for, prompt_token_ids, hf_reference):
    picked = list(range(0, len(prompt_token_ids), 3))  # batch size 1 is the slowest run: a third of the prompts
    engine = engine_for(max_num_seqs=1, enable_prefix_caching=False)
    results = engine.generate(_requests([prompt_token_ids[i] for i in picked], "bs1"))
    assert_matches_reference(results, [hf_reference[i] for i in picked])
    assert all(r.cached_tokens == 0 for r in results)


def test_greedy_matches_transformers_at_batch_7_with_chunked_prefill(engine_for, prompt_token_ids, hf_reference):
    engine = engine_for(max_num_seqs=7, max_num_batched_tokens=64, enable_prefix_caching=False)
    results = engine.generate(_requests(prompt_token_ids, "bs7"))
    assert_matches_reference(results, hf_reference)


def test_greedy_matches_transformers_at_batch_64_with_prefix_cache_cold_then_warm(engine_for, prompt_token_ids,
                                                                                  hf_reference):
    engine = engine_for(max_num_seqs=64, enable_prefix_caching=True)
    cold = engine.generate(_requests(prompt_token_ids, "cold"))
    assert_matches_reference(cold, hf_reference)
    assert sum(r.cached_tokens for r in cold[1:8]) > 0, "prompts sharing the document must reuse its blocks"
    warm = engine.generate(_requests(prompt_token_ids, "warm"))
    assert_matches_reference(warm, hf_reference)
    for res in warm:
        assert res.cached_tokens >= (res.prompt_tokens - 1) // 16 * 16 - 16, f"{res.request_id} missed the warm cache"


def test_greedy_matches_transformers_under_preemption(engine_for, loaded_model, prompt_token_ids, hf_reference):
    cfg = loaded_model.hf_model.config
    bytes_per_block = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 64 * 16 * 4
    longest = max(len(p) for p in prompt_token_ids) + MAX_NEW_TOKENS
    engine = engine_for(max_num_seqs=64, kv_cache_bytes=bytes_per_block * (longest // 16 + 6))
    picked = [i for i in range(len(prompt_token_ids)) if i % 8 < 4]  # half of each prompt family, to save time
    results = engine.generate(_requests([prompt_token_ids[i] for i in picked], "preempt"))
    assert engine.num_preemptions > 0, "the KV budget was meant to force preemption"
    assert_matches_reference(results, [hf_reference[i] for i in picked])
