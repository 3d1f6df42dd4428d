"""The transformers reference path (BATCHINFER_ENGINE=hf) samples and stops as the engine does: the same
Sampler and StopChecker, only the forward pass differs."""
from __future__ import annotations

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.runtime.hf_generate import HFGenerator

CASES = [  # (user message, sampling): few tokens each, the HF path runs one forward per token
    ("Answer yes or no only: is the sky blue?", SamplingParams(max_tokens=12, temperature=0)),  # ends at EOS
    ("Say hello.", SamplingParams(max_tokens=12, temperature=0, stop=("!",))),  # ends at the stop string
    ("Write one short sentence about cats.", SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=7)),
    ("List three colours, separated by commas.", SamplingParams(max_tokens=8, top_k=20, seed=3, stop=(",",))),
]


def _requests(tokenizer) -> list[GenerationRequest]:
    def chat(text: str) -> list[int]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False)
        return tokenizer.encode(prompt, add_special_tokens=False)
    return [GenerationRequest(f"r{i}", chat(text), sampling) for i, (text, sampling) in enumerate(CASES)]


def test_hf_reference_samples_and_stops_like_the_engine(loaded_model):
    engine = LLMEngine(loaded_model, EngineConfig(max_num_seqs=8, kv_cache_bytes=64 << 20))
    want = engine.generate(_requests(loaded_model.tokenizer))
    got = HFGenerator(loaded_model).generate(_requests(loaded_model.tokenizer))
    assert [(r.output_token_ids, r.text, r.finish_reason) for r in got] == \
           [(r.output_token_ids, r.text, r.finish_reason) for r in want]
    eos, stop_string = got[0], got[1]
    assert eos.finish_reason == "stop" and eos.output_token_ids[-1] == loaded_model.tokenizer.eos_token_id
    assert stop_string.finish_reason == "stop" and "!" not in stop_string.text and len(stop_string.output_token_ids) < 12
