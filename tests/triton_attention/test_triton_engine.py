"""The engine runs on the Triton backend (interpreted on CPU) and generates what the torch backend does.

The model is the real SmolLM2 cut to its first 4 layers: the interpreter runs a layer's kernels in
about a second, and 4 layers exercise the same code as 30.
"""
import os
from pathlib import Path

import pytest

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.attention import make_attention_backend
from batchinfer.engine.attention.triton_backend import TritonAttentionBackend
from batchinfer.engine.loading.loader import load_model

NUM_LAYERS = 4


@pytest.fixture(scope="module")
def short_model():
    cache = os.environ.get("BATCHINFER_MODEL_CACHE") or str(Path.home() / ".cache" / "batchinfer" / "models")
    loaded = load_model(None, cache)  # a fresh object: cutting its layers touches no other test's model
    loaded.hf_model.model.layers = loaded.hf_model.model.layers[:NUM_LAYERS]
    loaded.hf_model.config.num_hidden_layers = NUM_LAYERS
    return loaded


def _generate(loaded, backend: str) -> list:
    # A small token budget splits the long prompt into chunks (extend over a cached prefix) and mixes
    # them with other sequences' decode tokens; the repeated question hits the prefix cache.
    config = EngineConfig(attention_backend=backend, kv_cache_bytes=4 << 20, max_num_batched_tokens=32)
    engine = LLMEngine(loaded, config)
    chat = lambda text: engine.tokenizer.apply_chat_template(  # noqa: E731
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)["input_ids"]
    prompts = [chat("What is the capital of France?"), chat("What is the capital of France? Answer in one word."),
               chat("Name three colours of the rainbow.")]
    sampling = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    return engine.generate([GenerationRequest(f"r{i}", p, sampling) for i, p in enumerate(prompts)])


def test_triton_engine_generates_the_same_tokens_as_the_torch_backend(short_model):
    expected = _generate(short_model, "torch")
    results = _generate(short_model, "triton")
    assert [r.output_token_ids for r in results] == [r.output_token_ids for r in expected]
    assert sum(r.cached_tokens for r in results) > 0  # the prefix cache was used


def test_triton_backend_is_the_default_on_cuda_only():
    assert isinstance(make_attention_backend("auto", "cuda"), TritonAttentionBackend)
    assert not isinstance(make_attention_backend("auto", "cpu"), TritonAttentionBackend)
    assert isinstance(make_attention_backend("triton", "cpu"), TritonAttentionBackend)
