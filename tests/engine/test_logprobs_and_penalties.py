"""Logprobs from the sampler's own logits; presence/frequency/repetition penalties, logit_bias, min_tokens and
stop_token_ids on the real model."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams

LOOPING = "one two three one two three one two three one two three one two three one two three"


@pytest.fixture(scope="module")
def engine(loaded_model) -> LLMEngine:
    return LLMEngine(loaded_model, EngineConfig(max_num_seqs=16))


def chat(engine: LLMEngine, text: str) -> list[int]:
    tok = engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(prompt, add_special_tokens=False)


def run(engine: LLMEngine, prompt: list[int], **params):
    return engine.generate([GenerationRequest("r", prompt, SamplingParams(**params))])[0]


def test_logprobs_are_the_log_softmax_of_the_logits_the_sampler_drew_from(engine, monkeypatch):
    seen: list[torch.Tensor] = []
    draw = engine.runner.sampler.sample

    def spy(logits, request_ids, params):  # observes the sampler's input; the draw itself is the real one
        seen.append(logits[request_ids.index("r")].clone())
        return draw(logits, request_ids, params)

    monkeypatch.setattr(engine.runner.sampler, "sample", spy)
    result = run(engine, chat(engine, "Name three fruits."), max_tokens=8, temperature=0, logprobs=5,
                 frequency_penalty=0.5)
    assert result.logprobs is not None and len(result.logprobs) == len(result.output_token_ids) == len(seen)
    for entry, token, logits in zip(result.logprobs, result.output_token_ids, seen):
        expected = torch.log_softmax(logits.float(), dim=-1)
        assert entry.token_id == token
        assert abs(entry.logprob - expected[token].item()) < 1e-5
        assert len(entry.top) == 5 and entry.top[0][0] == token  # greedy: the top-1 alternative is the token
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)


def test_no_logprobs_unless_asked(engine):
    assert run(engine, chat(engine, "hi"), max_tokens=3, temperature=0).logprobs is None
    assert all(e.top == () for e in run(engine, chat(engine, "hi"), max_tokens=3, temperature=0, logprobs=0).logprobs)


def _repeats(tokens: list[int]) -> int:
    return sum(c - 1 for c in Counter(tokens).values())


def test_frequency_penalty_lowers_repeats_on_a_looping_prompt(engine):
    prompt = engine.tokenizer.encode(LOOPING, add_special_tokens=False)
    plain = run(engine, prompt, max_tokens=30, temperature=0, ignore_eos=True)
    penalized = run(engine, prompt, max_tokens=30, temperature=0, ignore_eos=True, frequency_penalty=2.0)
    assert _repeats(penalized.output_token_ids) < _repeats(plain.output_token_ids)


def test_presence_and_repetition_penalties_change_a_looping_output(engine):
    prompt = engine.tokenizer.encode(LOOPING, add_special_tokens=False)
    plain = run(engine, prompt, max_tokens=20, temperature=0, ignore_eos=True)
    assert _repeats(run(engine, prompt, max_tokens=20, temperature=0, ignore_eos=True,
                        presence_penalty=2.0).output_token_ids) < _repeats(plain.output_token_ids)
    assert run(engine, prompt, max_tokens=20, temperature=0, ignore_eos=True,
               repetition_penalty=1.5).output_token_ids != plain.output_token_ids


def test_logit_bias_minus_100_removes_a_token(engine):
    prompt = chat(engine, "Name three fruits.")
    plain = run(engine, prompt, max_tokens=10, temperature=0)
    banned = plain.output_token_ids[0]
    biased = run(engine, prompt, max_tokens=10, temperature=0, logit_bias={banned: -100})
    assert banned not in biased.output_token_ids


def test_min_tokens_holds_off_eos(engine):
    prompt = chat(engine, "Say only the word yes.")
    plain = run(engine, prompt, max_tokens=40, temperature=0)
    assert plain.finish_reason == "stop" and len(plain.output_token_ids) < 30
    held = run(engine, prompt, max_tokens=40, temperature=0, min_tokens=30)
    assert len(held.output_token_ids) >= 30


def test_stop_token_ids_stop_the_sequence(engine):
    prompt = chat(engine, "Name three fruits.")
    plain = run(engine, prompt, max_tokens=10, temperature=0)
    stop_at = plain.output_token_ids[3]
    stopped = run(engine, prompt, max_tokens=10, temperature=0, stop_token_ids=(stop_at,))
    assert stopped.finish_reason == "stop"
    assert stopped.output_token_ids == plain.output_token_ids[:plain.output_token_ids.index(stop_at) + 1]


def test_penalties_of_one_row_leave_its_batch_companions_alone(engine):
    prompt = chat(engine, "Name three fruits.")
    alone = run(engine, prompt, max_tokens=10, temperature=0, logprobs=2)
    reqs = [GenerationRequest("plain", prompt, SamplingParams(max_tokens=10, temperature=0, logprobs=2)),
            GenerationRequest("pen", prompt, SamplingParams(max_tokens=10, temperature=0, frequency_penalty=2.0,
                                                            logit_bias={alone.output_token_ids[0]: -100}))]
    together = engine.generate(reqs)
    assert together[0].output_token_ids == alone.output_token_ids
    assert together[1].output_token_ids[0] != alone.output_token_ids[0]
