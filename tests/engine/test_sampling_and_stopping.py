"""Seeded sampling independent of batch companions, stop strings, EOS, max_tokens, metrics."""
from __future__ import annotations

import pytest

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine(loaded_model) -> LLMEngine:
    return LLMEngine(loaded_model, EngineConfig(max_num_seqs=16))


def chat(engine: LLMEngine, text: str) -> list[int]:
    tok = engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(prompt, add_special_tokens=False)


def test_same_seed_gives_same_tokens_whatever_the_batch(engine):
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=40, seed=1234)
    target = GenerationRequest("alone", chat(engine, "Write a sentence about the moon."), params)
    alone = engine.generate([target])[0]
    companions = [GenerationRequest(f"c{i}", chat(engine, f"Tell me fact number {i} about cats."),
                                    SamplingParams(max_tokens=6 + i, temperature=1.0, seed=i)) for i in range(5)]
    crowded = engine.generate(companions[:2] + [GenerationRequest("crowded", target.prompt_token_ids, params)]
                              + companions[2:])[2]
    assert crowded.output_token_ids == alone.output_token_ids


def test_different_seeds_give_different_samples(engine):
    prompt = chat(engine, "Invent a name for a cat.")
    outs = {tuple(engine.generate([GenerationRequest(f"s{s}", prompt, SamplingParams(max_tokens=8, temperature=1.2,
                                                                                       seed=s))])[0].output_token_ids)
            for s in range(4)}
    assert len(outs) > 1


def test_top_k_one_is_greedy(engine):
    prompt = chat(engine, "Name a colour.")
    greedy = engine.generate([GenerationRequest("g", prompt, SamplingParams(max_tokens=6, temperature=0))])[0]
    top1 = engine.generate([GenerationRequest("k", prompt, SamplingParams(max_tokens=6, temperature=1.5, top_k=1,
                                                                          seed=3))])[0]
    assert top1.output_token_ids == greedy.output_token_ids


def test_stop_string_cuts_the_text_and_finishes_with_stop(engine):
    prompt = chat(engine, "Count from one to ten in words, separated by commas.")
    free = engine.generate([GenerationRequest("free", prompt, SamplingParams(max_tokens=24, temperature=0,
                                                                             ignore_eos=True))])[0]
    middle = len(free.text) // 2
    stop = free.text[middle:middle + 3]  # whatever this small model writes, stop in the middle of it
    cut = engine.generate([GenerationRequest("cut", prompt, SamplingParams(max_tokens=24, temperature=0,
                                                                           ignore_eos=True, stop=(stop,)))])[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:free.text.index(stop)]
    assert cut.completion_tokens < free.completion_tokens
    assert cut.output_token_ids == free.output_token_ids[:cut.completion_tokens]


def test_max_tokens_finishes_with_length(engine):
    res = engine.generate([GenerationRequest("len", chat(engine, "Tell me a long story."),
                                             SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))])[0]
    assert res.finish_reason == "length" and res.completion_tokens == 5


def test_eos_finishes_with_stop_and_is_not_in_the_text(engine):
    res = engine.generate([GenerationRequest("eos", chat(engine, "Say hi."), SamplingParams(max_tokens=64,
                                                                                              temperature=0))])[0]
    assert res.finish_reason == "stop"
    assert res.output_token_ids[-1] == engine.tokenizer.eos_token_id
    assert "<|im_end|>" not in res.text and res.text


def test_warm_run_reports_cached_tokens_and_metrics_are_ordered(engine):
    prompt = chat(engine, "Describe a lighthouse at night in a few words. " * 4)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    cold = engine.generate([GenerationRequest("cold", prompt, params)])[0]
    warm = engine.generate([GenerationRequest("warm", prompt, params)])[0]
    assert warm.cached_tokens >= len(prompt) - 16 > 0
    assert warm.output_token_ids == cold.output_token_ids
    for r in (cold, warm):
        assert r.prompt_tokens == len(prompt)
        assert r.arrival_time <= r.first_scheduled_time <= r.first_token_time <= r.last_token_time
        assert r.queue_s >= 0 and 0 < r.ttft_s <= r.e2e_s and r.tpot_s > 0


def test_cache_salt_keeps_a_prompt_from_hitting_another_salts_blocks(engine):
    prompt = chat(engine, "Summarise the rules of chess for a beginner in one line. " * 4)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    first = engine.generate([GenerationRequest("salt-a", prompt, params, cache_salt="tenant-a")])[0]
    other = engine.generate([GenerationRequest("salt-b", prompt, params, cache_salt="tenant-b")])[0]
    same = engine.generate([GenerationRequest("salt-a2", prompt, params, cache_salt="tenant-a")])[0]
    assert first.cached_tokens == 0 and other.cached_tokens == 0
    assert same.cached_tokens >= len(prompt) - 16 > 0
    assert other.output_token_ids == same.output_token_ids == first.output_token_ids


def test_on_result_sees_every_request_and_the_list_keeps_input_order(engine):
    reqs = [GenerationRequest(f"o{i}", chat(engine, f"Say the number {i}."),
                              SamplingParams(max_tokens=2 + 3 * (i % 3), temperature=0, ignore_eos=True))
            for i in range(6)]
    seen = []
    results = engine.generate(reqs, on_result=lambda r: seen.append(r.request_id))
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    assert sorted(seen) == sorted(r.request_id for r in reqs)


def test_abort_frees_the_request_blocks(engine):
    engine.add_request(GenerationRequest("doomed", chat(engine, "Tell me a story."),
                                         SamplingParams(max_tokens=50, temperature=0)))
    engine.step()
    engine.abort("doomed")
    assert not engine.has_unfinished()
    engine.block_manager.check_integrity([])


def test_generate_stops_aborted_requests_and_the_rest_run_on(engine):
    """aborts() is asked before every step: a running request and a waiting one stop there, their blocks are
    freed, and the requests beside them give the tokens they give alone."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = {rid: chat(engine, f"Count to ten, request {rid}.") for rid in ("keep", "stop-running", "stop-waiting")}
    alone = engine.generate([GenerationRequest("keep", prompts["keep"], params)])[0]
    steps = 0

    def aborts() -> list[str]:
        nonlocal steps
        steps += 1
        return ["stop-running", "stop-waiting"] if steps == 3 else []

    waiting = GenerationRequest("stop-waiting", prompts["stop-waiting"], params)
    before, engine.scheduler.max_num_seqs = engine.scheduler.max_num_seqs, 2  # the third request waits
    try:
        results = engine.generate([GenerationRequest("keep", prompts["keep"], params),
                                   GenerationRequest("stop-running", prompts["stop-running"], params), waiting],
                                  aborts=aborts)
    finally:
        engine.scheduler.max_num_seqs = before
    keep, running, never = results
    assert keep.output_token_ids == alone.output_token_ids and keep.finish_reason == "length"
    assert running.finish_reason == "abort" and 0 < running.completion_tokens < params.max_tokens
    assert never.finish_reason == "abort" and never.completion_tokens == 0
    assert not engine.has_unfinished() and not engine.seqs
    engine.block_manager.check_integrity([])


def test_greedy_takes_the_first_of_equal_maxima_as_argmax_does():
    import torch

    from batchinfer.engine.sampling.sampler import Sampler

    logits = torch.zeros(3, 49152)
    logits[0, [700, 300]] = 2.0  # a tie: the lower id wins, as torch.argmax and transformers' greedy pick
    logits[1, 49151] = 1.0
    logits[2] = torch.randn(49152, generator=torch.Generator().manual_seed(0))
    picked = Sampler().sample(logits, ["a", "b", "c"], [SamplingParams(temperature=0.0)] * 3)
    assert picked == [300, 49151, int(logits[2].argmax())]
