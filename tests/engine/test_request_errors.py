"""A request the engine cannot run gets an error result of its own; the rest of the batch runs."""
from __future__ import annotations

import pytest

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.types import refusal


@pytest.fixture(scope="module")
def engine(loaded_model) -> LLMEngine:
    return LLMEngine(loaded_model, EngineConfig(max_num_seqs=8, kv_cache_bytes=64 << 20, max_model_len=256))


def test_bad_requests_fail_alone_and_the_good_ones_run(engine):
    good = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    reqs = [GenerationRequest("ok1", good, params),
            GenerationRequest("seed", good, SamplingParams(max_tokens=3, temperature=1.0, seed=1 << 70)),
            GenerationRequest("long", list(range(1, 300)), params),
            GenerationRequest("empty", [], params),
            GenerationRequest("ok2", good + [9], params)]
    seen = []
    results = engine.generate(reqs, on_result=lambda r: seen.append(r.request_id))
    by_id = {r.request_id: r for r in results}
    assert [r.request_id for r in results] == [r.request_id for r in reqs]
    assert sorted(seen) == sorted(r.request_id for r in reqs)
    for rid, words in (("seed", "seed"), ("long", "max_model_len"), ("empty", "empty prompt")):
        assert by_id[rid].finish_reason == "error" and not by_id[rid].ok and words in by_id[rid].error
        assert by_id[rid].output_token_ids == []
    for rid in ("ok1", "ok2"):
        assert by_id[rid].ok and by_id[rid].completion_tokens == 3 and by_id[rid].finish_reason == "length"
    assert not engine.has_unfinished()


def test_a_duplicate_id_in_one_batch_keeps_its_own_error(engine):
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    results = engine.generate([GenerationRequest("d", [5, 6], params), GenerationRequest("d", [7, 8], params)])
    assert results[0].ok and results[0].completion_tokens == 2
    assert results[1].finish_reason == "error" and "duplicate" in results[1].error


@pytest.mark.fast
@pytest.mark.parametrize("prompt, seed, refused", [
    ([5], (1 << 64) - 1, None), ([5], -(1 << 63), None), ([5], 1 << 64, "seed"), ([5], -(1 << 63) - 1, "seed"),
    ([], None, "empty prompt"), (list(range(255)), None, None), (list(range(256)), None, "max_model_len")])
def test_refusal_is_the_one_rule_every_generator_applies(prompt, seed, refused):
    """LLMEngine.check_request and HFGenerator both refuse by engine.types.refusal; validation takes the same seeds."""
    problem = refusal(GenerationRequest("r", prompt, SamplingParams(seed=seed)), max_model_len=256)
    assert (problem is None) if refused is None else (refused in problem)
