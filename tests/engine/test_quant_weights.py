"""weight_format "gguf" on the real model: the GGUF's own Q4_1/Q8_0 blocks, checked the vLLM way
(check_logprobs_close) against transformers fp32 greedy output, as tests/engine/test_bf16_fidelity.py does bf16."""
from __future__ import annotations

import pytest
import torch
from conftest import MAX_NEW_TOKENS, model_cache_dir
from greedy_closeness import LogitsRecorder, greedy_closeness

from batchinfer.engine import EngineConfig, LLMEngine
from batchinfer.engine.layers import quant_build
from batchinfer.engine.layers.quant_build import cpu_supported
from batchinfer.engine.loader import load_model_light
from batchinfer.engine.native_build import avx512_supported
from batchinfer.engine.quant_weights import UnsupportedWeightFormat

pytestmark = pytest.mark.skipif(not cpu_supported(), reason="the quantized kernel needs AVX2, FMA and F16C")
@pytest.fixture(scope="module")
def gguf_engine():
    loaded = load_model_light(None, model_cache_dir(), torch.float32, "gguf")
    assert loaded.quant is not None and loaded.quant["layers.0.qkv_proj"].format == "q4_1"
    assert loaded.quant["lm_head"].format == "q8_0"  # the file's token embedding, tied
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=32, weight_format="gguf"))
    engine.runner.sampler = LogitsRecorder()
    return engine


def test_gguf_weights_greedy_is_close_to_transformers_fp32(gguf_engine, loaded_model, prompt_token_ids, hf_reference):
    exact, problems = greedy_closeness(gguf_engine, loaded_model, prompt_token_ids, hf_reference, MAX_NEW_TOKENS)
    print(f"\ngguf weights, exact match with transformers fp32: {exact}/{len(prompt_token_ids)} prompts")
    assert not problems, problems


def test_gguf_format_on_a_safetensors_checkpoint_is_refused_in_one_line():
    folder = load_model_light(None, model_cache_dir()).path  # the converted folder: safetensors, no GGUF
    with pytest.raises(UnsupportedWeightFormat, match="needs a .gguf checkpoint"):
        load_model_light(folder, model_cache_dir(), torch.float32, "gguf")
    auto = load_model_light(folder, model_cache_dir(), torch.float32, "auto")
    assert auto.quant is None and (auto.weight_format, auto.weight_format_reason) == ("dense", "auto: not a GGUF checkpoint")


def test_the_default_runs_the_ggufs_own_blocks_here_and_says_why():
    engine = LLMEngine.from_pretrained(None, model_cache_dir(), EngineConfig(kv_cache_bytes=16 << 20))
    assert engine.runner.model.quant is not None and engine.runner.model.quant["layers.0.qkv_proj"].lib is not None
    cpu = "avx512f: the kernel's AVX-512 build" if avx512_supported() else "avx2 fma f16c"  # the build it runs
    assert engine.weights_note == f"gguf (auto: the GGUF's own Q4_1/Q8_0 blocks, CPU has {cpu})"
    assert EngineConfig().weight_format == "auto" and LLMEngine(
        load_model_light(None, model_cache_dir(), torch.float32, "dense"), EngineConfig()).weights_note == "dense (asked)"


def test_auto_is_dense_on_a_cpu_without_the_kernels_flags(monkeypatch):
    monkeypatch.setattr(quant_build, "cpu_supported", lambda: False)
    loaded = load_model_light(None, model_cache_dir(), torch.float32)
    assert loaded.quant is None
    assert (loaded.weight_format, loaded.weight_format_reason) == ("dense", "auto: the quantized kernel needs avx2/fma/f16c")
    with pytest.raises(ValueError, match="the loaded model holds 'dense' weights"):
        LLMEngine(loaded, EngineConfig(weight_format="gguf"))  # an explicit format is the one loaded, or an error
