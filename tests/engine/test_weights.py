"""The engine-layout weight cache (engine/loading/weights.py): built once per dtype, then mapped, never copied."""
from __future__ import annotations

from pathlib import Path

import torch

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.loading.loader import load_model_light
from batchinfer.engine.loading.weights import cache_path, engine_weights


def test_cached_weights_equal_the_conversion_and_the_engine_uses_them_without_a_copy(loaded_model, model_cache):
    folder = Path(loaded_model.path)
    want = engine_weights(loaded_model.hf_model, torch.bfloat16)
    first = load_model_light(None, model_cache, torch.bfloat16, "dense")  # the real cache, as a dense worker uses it
    assert cache_path(folder, model_cache, torch.bfloat16).is_file()
    assert first.weights.keys() == want.keys()
    assert all(torch.equal(first.weights[k], want[k]) for k in want)
    engine = LLMEngine(first, EngineConfig(dtype="bfloat16", kv_cache_bytes=16 << 20))
    layer = engine.runner.model.layers[3]
    assert layer.qkv_proj.data_ptr() == first.weights["layers.3.qkv_proj"].data_ptr()
    assert engine.runner.model.lm_head.data_ptr() == first.weights["embed"].data_ptr()  # tied head


def test_an_unwritable_cache_still_loads(loaded_model, tmp_path):
    folder = Path(loaded_model.path)
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")
    loaded = load_model_light(str(folder), blocked, torch.float32)
    assert not cache_path(folder, blocked, torch.float32).exists()
    assert torch.equal(loaded.weights["layers.0.down_proj"], loaded_model.hf_model.model.layers[0].mlp.down_proj.weight)


def test_engine_from_the_cache_gives_the_same_greedy_tokens_as_converting_at_load(loaded_model, model_cache,
                                                                                prompt_token_ids):
    params = SamplingParams(max_tokens=4, temperature=0)
    config = EngineConfig(dtype="bfloat16", kv_cache_bytes=64 << 20)
    reqs = [GenerationRequest(f"r{i}", ids, params) for i, ids in enumerate(prompt_token_ids[:4])]
    # the dense layout is what this compares (weight_format auto would run the GGUF's blocks: test_gguf_model.py)
    cached = LLMEngine(load_model_light(None, model_cache, torch.bfloat16, "dense"), config).generate(reqs)
    converted = LLMEngine(loaded_model, config).generate(reqs)
    assert [r.output_token_ids for r in cached] == [r.output_token_ids for r in converted]
