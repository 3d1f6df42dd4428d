"""n > 1 on the real model: the prompt is prefilled once and forked, each sample has its own seed, the prompt
is counted once, and sample i is the request a lone seeded request would have been."""
from __future__ import annotations

import pytest

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.scheduler.parallel_sampling import sample_seed

SEED = 1234


@pytest.fixture(scope="module")
def engine(loaded_model) -> LLMEngine:
    return LLMEngine(loaded_model, EngineConfig(max_num_seqs=16, kv_cache_bytes=64 << 20))


def prompt(engine: LLMEngine, text: str) -> list[int]:
    tok = engine.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(chat, add_special_tokens=False)


def request(rid: str, ids: list[int], n: int = 4, seed: int | None = SEED, **params) -> GenerationRequest:
    params = {"max_tokens": 6, "temperature": 1.0, **params}
    return GenerationRequest(rid, ids, SamplingParams(seed=seed, n=n, **params))


def test_four_seeded_samples_share_the_prompt_blocks_and_come_back_the_same(engine):
    ids = prompt(engine, "Invent a name for a new colour and describe it in one sentence.")
    assert (len(ids) - 1) % engine.config.block_size, "the test wants a partial last prompt block to copy"
    prompt_blocks = -(-(len(ids) - 1) // engine.config.block_size)
    before = engine.stats()
    first = engine.generate([request("a", ids)])[0]
    after = engine.stats()
    assert first.ok and first.samples is not None and len(first.samples) == 4
    texts = [s.text for s in first.samples]
    assert len(set(texts)) == 4, texts
    assert first.prompt_tokens == len(ids)  # counted once, not four times
    assert first.completion_tokens == sum(len(s.output_token_ids) for s in first.samples)
    assert after["forked_blocks"] - before["forked_blocks"] == 4 * prompt_blocks
    assert after["cow_copies"] - before["cow_copies"] == 3  # three samples copy the partial block, one keeps it
    again = engine.generate([request("b", ids)])[0]
    assert [s.output_token_ids for s in again.samples] == [s.output_token_ids for s in first.samples]
    assert again.cached_tokens > 0  # the rerun's prompt came from the prefix cache


def test_each_sample_is_what_a_lone_request_with_its_seed_gives(engine):
    ids = prompt(engine, "Give me a random animal and a random city.")
    beside = [request(f"other{i}", prompt(engine, f"Count to {i + 3}."), n=1, seed=i) for i in range(3)]
    grouped = engine.generate([beside[0], request("g", ids), *beside[1:]])[1]
    lone = engine.generate([request(f"lone{i}", ids, n=1, seed=sample_seed(SEED, i)) for i in range(4)])
    assert [s.output_token_ids for s in grouped.samples] == [r.output_token_ids for r in lone]
    assert lone[0].output_token_ids == grouped.output_token_ids  # sample 0 keeps the request's seed


def test_one_token_prompt_and_greedy_samples(engine):
    result, greedy = engine.generate([request("one", [engine.tokenizer.encode("Hi")[0]], n=3),
                                      request("greedy", prompt(engine, "Say hello."), n=3, temperature=0.0)])
    assert result.ok and len(result.samples) == 3
    assert len({tuple(s.output_token_ids) for s in greedy.samples}) == 1


def test_abort_stops_every_sample_and_frees_their_blocks(engine):
    ids = prompt(engine, "Write a long story about a lighthouse keeper.")
    engine.add_request(request("x", ids, n=4, max_tokens=64))
    for _ in range(3):
        assert engine.step() == []
    result = engine.abort("x")
    assert result is not None and result.aborted and len(result.samples) == 4
    assert not engine.has_unfinished() and not engine.parents and not engine.parent_of
    engine.block_manager.check_integrity([])
