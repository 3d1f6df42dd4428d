"""Embed requests: the engine runs the prompt only (no token sampled) and pools its final hidden states,
matching transformers' own hidden states (fp32) within 1e-4, chunked prefill and the prefix cache included."""
from __future__ import annotations

import pytest
import torch

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams

TEXTS = ["The cat sat on the mat.", "A completely different sentence about tax law and invoices.",
         "The cat sat on the mat.", "Short"]
EMBED = SamplingParams(max_tokens=1, embed=True)


def _reference(loaded_model, ids: list[int], pooling: str) -> torch.Tensor:
    with torch.inference_mode():
        out = loaded_model.hf_model(torch.tensor([ids]), output_hidden_states=True)
    states = out.hidden_states[-1][0].float()  # after the final norm
    pooled = states[-1] if pooling == "last" else states.mean(0)
    return torch.nn.functional.normalize(pooled, dim=0)


@pytest.fixture(scope="module")
def prompts(loaded_model) -> list[list[int]]:
    return [loaded_model.tokenizer.encode(t) for t in TEXTS]


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("chunk", [2048, 5])  # 5 tokens a step: every prompt is prefilled in chunks
def test_embeddings_match_transformers_pooling(loaded_model, prompts, pooling, chunk):
    engine = LLMEngine(loaded_model, EngineConfig(pooling=pooling, max_num_batched_tokens=chunk, dtype="float32"))
    results = engine.generate([GenerationRequest(f"e{i}", ids, EMBED) for i, ids in enumerate(prompts)])
    for result, ids in zip(results, prompts):
        assert result.output_token_ids == [] and result.prompt_tokens == len(ids) and result.finish_reason == "stop"
        got = torch.tensor(result.embedding)
        assert got.shape == (loaded_model.hf_model.config.hidden_size,)
        assert abs(got.norm().item() - 1) < 1e-5
        assert torch.allclose(got, _reference(loaded_model, ids, pooling), atol=1e-4)
    same, different = torch.tensor(results[0].embedding), torch.tensor(results[1].embedding)
    assert torch.allclose(same, torch.tensor(results[2].embedding), atol=1e-6)  # identical inputs
    assert (same - different).abs().max() > 1e-2


def test_embed_and_generate_share_a_batch(loaded_model, prompts):
    greedy = SamplingParams(max_tokens=6, temperature=0)
    alone = LLMEngine(loaded_model, EngineConfig(dtype="float32")).generate(
        [GenerationRequest("g", prompts[1], greedy)])
    engine = LLMEngine(loaded_model, EngineConfig(dtype="float32"))
    mixed = engine.generate([GenerationRequest("e", prompts[0], EMBED), GenerationRequest("g", prompts[1], greedy)])
    assert mixed[1].output_token_ids == alone[0].output_token_ids and mixed[1].embedding is None
    assert mixed[0].embedding is not None and mixed[0].output_token_ids == []
    assert not engine.has_unfinished() and engine.stats()["running"] == 0
