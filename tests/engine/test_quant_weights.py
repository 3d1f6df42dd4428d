"""weight_format "gguf" on the real model: the GGUF's own Q4_1/Q8_0 blocks, checked the vLLM way
(check_logprobs_close) against transformers fp32 greedy output, as tests/engine/test_bf16_fidelity.py does bf16."""
from __future__ import annotations

import pytest
import torch
from conftest import MAX_NEW_TOKENS, model_cache_dir

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.layers.quant_build import cpu_supported
from batchinfer.engine.loader import load_model_light
from batchinfer.engine.quant_weights import UnsupportedWeightFormat
from batchinfer.engine.sampler import Sampler

pytestmark = pytest.mark.skipif(not cpu_supported(), reason="the quantized kernel needs AVX2, FMA and F16C")
TOP = 5


class LogitsRecorder(Sampler):
    def sample(self, logits, request_ids, params):
        self.last = dict(zip(request_ids, logits.float().cpu()))
        return super().sample(logits, request_ids, params)


@pytest.fixture(scope="module")
def gguf_engine():
    loaded = load_model_light(None, model_cache_dir(), torch.float32, "gguf")
    assert loaded.quant is not None and loaded.quant["layers.0.qkv_proj"].format == "q4_1"
    assert loaded.quant["lm_head"].format == "q8_0"  # the file's token embedding, tied
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=32, weight_format="gguf"))
    engine.runner.sampler = LogitsRecorder()
    return engine


def test_gguf_weights_greedy_is_close_to_transformers_fp32(gguf_engine, loaded_model, prompt_token_ids, hf_reference):
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
    results = gguf_engine.generate([GenerationRequest(f"p{i}", ids, params) for i, ids in enumerate(prompt_token_ids)])
    exact, problems = 0, []
    for i, (ids, ref, res) in enumerate(zip(prompt_token_ids, hf_reference, results)):
        ours, theirs = res.output_token_ids, ref.tokens[:len(res.output_token_ids)]
        first = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if first is None:
            exact += 1
            continue
        context = ids + theirs[:first]
        with torch.inference_mode():
            hf_top = torch.topk(loaded_model.hf_model(torch.tensor([context])).logits[0, -1], TOP).indices.tolist()
        gguf_engine.generate([GenerationRequest(f"top{i}", context, SamplingParams(max_tokens=1, temperature=0))])
        our_top = torch.topk(gguf_engine.runner.sampler.last[f"top{i}"], TOP).indices.tolist()
        if ours[first] not in hf_top or theirs[first] not in our_top:
            problems.append((i, first, ours[first], hf_top, theirs[first], our_top))
    print(f"\ngguf weights, exact match with transformers fp32: {exact}/{len(results)} prompts")
    assert not problems, problems


def test_gguf_format_on_a_safetensors_checkpoint_is_refused_in_one_line():
    folder = load_model_light(None, model_cache_dir()).path  # the converted folder: safetensors, no GGUF
    with pytest.raises(UnsupportedWeightFormat, match="needs a .gguf checkpoint"):
        load_model_light(folder, model_cache_dir(), torch.float32, "gguf")
    assert load_model_light(folder, model_cache_dir(), torch.float32, "auto").quant is None  # auto: dense
