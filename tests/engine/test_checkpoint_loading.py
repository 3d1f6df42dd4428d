"""Checkpoints as they ship: sharded safetensors, tied and untied heads, bf16/fp16 weights, the chat template
from tokenizer_config.json, EOS from generation_config.json, and refusals naming what the engine cannot run."""
from __future__ import annotations

import json

import pytest
import torch

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.loading.light_loader import LightTokenizer, weight_files
from batchinfer.engine.loading.loader import load_model, load_model_light
from batchinfer.engine.unsupported import UnsupportedModelError
from batchinfer.engine.loading.weights import engine_weights
from tests.engine.test_model_families import family_prompts, hf_reference, run_engine
from tests.engine.tiny_families import build_family_checkpoint

CONFIG = EngineConfig(dtype="float32", max_num_seqs=4, kv_cache_bytes=4 << 20)


def _greedy(folder, cache, prompts, config=CONFIG) -> list[list[int]]:
    engine = LLMEngine.from_pretrained(str(folder), cache, config)
    return [r.output_token_ids for r in run_engine(engine, prompts, "r")]


def _edit_json(path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_a_sharded_checkpoint_loads_light_and_matches_the_single_file(tmp_path):
    single = build_family_checkpoint("qwen2", tmp_path / "single")
    sharded = build_family_checkpoint("qwen2", tmp_path / "sharded", max_shard_size="60KB")
    assert len(weight_files(sharded)) > 2 and (sharded / "model.safetensors.index.json").exists()
    prompts = family_prompts()[:4]
    loaded = load_model_light(str(sharded), tmp_path / "cache", torch.float32)
    assert loaded.weights is not None and not hasattr(loaded.hf_model, "generate")  # no transformers object
    assert _greedy(sharded, tmp_path / "cache", prompts) == _greedy(single, tmp_path / "cache", prompts)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_heads(tmp_path, tied):
    folder = build_family_checkpoint("llama", tmp_path / "m", tie_word_embeddings=tied)
    loaded = load_model_light(str(folder), tmp_path / "cache", torch.float32)
    assert ("lm_head" in loaded.weights) is (not tied)
    engine = LLMEngine(loaded, CONFIG)
    assert (engine.runner.model.lm_head.data_ptr() == engine.runner.model.embed.data_ptr()) is tied
    prompts = family_prompts()[:3]
    want, _ = hf_reference(load_model(str(folder), tmp_path / "cache").hf_model, prompts)
    assert [r.output_token_ids for r in run_engine(engine, prompts, "r")] == want


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_weights_run_in_fp32_like_transformers(tmp_path, dtype):
    folder = build_family_checkpoint("qwen3", tmp_path / "m", dtype=dtype)
    prompts = family_prompts()[:3]
    reference = load_model(str(folder), tmp_path / "cache").hf_model  # upcast to fp32, as the engine does
    want, _ = hf_reference(reference, prompts)
    assert _greedy(folder, tmp_path / "cache", prompts) == want


def test_the_chat_template_comes_from_tokenizer_config(tmp_path):
    folder = build_family_checkpoint("llama", tmp_path / "m")
    template = (folder / "chat_template.jinja").read_text().replace("assistant", "model")
    (folder / "chat_template.jinja").unlink()
    _edit_json(folder / "tokenizer_config.json", chat_template=template)
    text = LightTokenizer(folder).apply_chat_template([{"role": "user", "content": "hi"}],
                                                      add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>model\n"


def test_eos_ids_come_from_generation_config(tmp_path):
    folder = build_family_checkpoint("llama", tmp_path / "m")
    prompt = family_prompts()[0]
    free = _greedy(folder, tmp_path / "cache", [prompt])[0]
    stop_at = free[2]
    _edit_json(folder / "generation_config.json", eos_token_id=[2, stop_at])
    engine = LLMEngine.from_pretrained(str(folder), tmp_path / "cache2", CONFIG)
    result = engine.generate([GenerationRequest("r", prompt, SamplingParams(max_tokens=8, temperature=0))])[0]
    assert result.finish_reason == "stop"
    assert result.output_token_ids == free[:free.index(stop_at) + 1]


def test_an_unsupported_architecture_is_refused_with_its_name(tmp_path):
    folder = build_family_checkpoint("llama", tmp_path / "m")
    _edit_json(folder / "config.json", architectures=["FalconForCausalLM"])
    with pytest.raises(UnsupportedModelError, match="^unsupported model FalconForCausalLM: is not an architecture"):
        LLMEngine.from_pretrained(str(folder), tmp_path / "cache", CONFIG)


def test_an_unsupported_feature_is_refused_with_the_architecture_and_feature(tmp_path):
    folder = build_family_checkpoint("llama", tmp_path / "m")
    _edit_json(folder / "config.json", rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0})
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM: rope_type 'longrope' is not supported"):
        LLMEngine.from_pretrained(str(folder), tmp_path / "cache", CONFIG)


def test_an_older_config_spelling_runs_the_same(tmp_path):
    """config.json as transformers 4 wrote it: rope_theta and rope_scaling, no layer_types (Gemma 2
    then slides on even layers)."""
    folder = build_family_checkpoint("gemma2", tmp_path / "m")
    prompts = family_prompts()[4:7]
    want = _greedy(folder, tmp_path / "cache", prompts)
    config = json.loads((folder / "config.json").read_text())
    config.pop("layer_types")
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    (folder / "config.json").write_text(json.dumps(config))
    (tmp_path / "cache").rename(tmp_path / "old-cache")  # the engine layout is rebuilt from the edited folder
    assert _greedy(folder, tmp_path / "cache", prompts) == want


@pytest.mark.parametrize("family", ["qwen3-moe", "phi3", "gemma3"])
def test_a_transformers_model_object_converts_to_the_same_engine_weights(tmp_path, family):
    """The reference path (load_model) holds transformers 5's fused experts and Gemma's raw norm weights; the
    light path reads the per-expert tensors the checkpoint ships: both give one engine layout."""
    folder = build_family_checkpoint(family, tmp_path / "m")
    light = load_model_light(str(folder), tmp_path / "cache", torch.float32).weights
    converted = engine_weights(load_model(str(folder), tmp_path / "cache").hf_model, torch.float32)
    assert light is not None and light.keys() == converted.keys()
    assert all(torch.equal(light[k], converted[k]) for k in light)
