"""LoRA adapters on our engine against transformers + peft (float32 greedy: identical tokens, logprobs within
1e-4), rows of the base and of several adapters in one step, and what the adapters must never change: a row's
output whatever shares its step, the prefix cache of another adapter, an adapter that does not fit the base."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.lora import LoRARequest
from tests.engine.test_gguf_families import checkpoint_and_gguf, gguf_engine, needs_kernel
from tests.engine.test_model_families import (LOGPROB_TOLERANCE, MAX_NEW_TOKENS, assert_exact, check_logprobs_close, family_prompts,
                                              hf_reference, record_logprobs)
from tests.engine.tiny_adapters import ALL_LINEAR, ATTENTION, build_adapter, peft_model
from tests.engine.tiny_families import build_family_checkpoint

# family -> two adapters (rank, peft target modules, rslora): phi3 fuses qkv and gate/up in its checkpoint
ADAPTERS = {
    "llama": [(8, ALL_LINEAR, False), (4, ["q_proj", "v_proj", "down_proj"], True)],
    "qwen2": [(16, ["k_proj", "o_proj", "up_proj"], False), (2, ALL_LINEAR, True)],
    "phi3": [(8, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], False), (4, ["qkv_proj"], True)],
}
PARAMS = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)


def fresh_engine(base: Path, cache: Path, **overrides) -> LLMEngine:
    config = EngineConfig(dtype="float32", max_num_seqs=8, max_num_batched_tokens=64, kv_cache_bytes=8 << 20,
                          **overrides)
    return LLMEngine.from_pretrained(str(base), cache, config)


def lora(folder: Path, number: int) -> LoRARequest:
    return LoRARequest(folder.name, number, str(folder))


@pytest.fixture(scope="module", params=list(ADAPTERS))
def family(request, tmp_path_factory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp(request.param)
    base = build_family_checkpoint(request.param, root / "base")
    adapters = [build_adapter(base, root / f"adapter{i + 1}", r, targets, seed=i + 1, rslora=rslora)
                for i, (r, targets, rslora) in enumerate(ADAPTERS[request.param])]
    return base, adapters


def test_base_and_two_adapters_in_one_batch_match_transformers_and_peft(family, tmp_path):
    assert_mixed_batch_matches_peft(*family, tmp_path)


# more families, once each: sliding windows (mistral), soft-caps and sandwich norms (gemma2), q/k norms and an
# experts layer beside a dense one (qwen3-moe: attention only, the engine refuses adapters of experts)
MORE = {"mistral": [(8, ALL_LINEAR, False), (4, ["v_proj", "o_proj"], True)],
        "gemma2": [(8, ALL_LINEAR, False), (2, ["q_proj", "gate_proj"], False)],
        "qwen3-moe": [(8, ATTENTION, False), (4, ["q_proj", "k_proj"], True)]}


@pytest.mark.parametrize("name", list(MORE))
def test_more_families_match_transformers_and_peft(name, tmp_path):
    base = build_family_checkpoint(name, tmp_path / "base")
    adapters = [build_adapter(base, tmp_path / f"adapter{i + 1}", r, targets, seed=i + 1, rslora=rslora)
                for i, (r, targets, rslora) in enumerate(MORE[name])]
    assert_mixed_batch_matches_peft(base, adapters, tmp_path)


def assert_mixed_batch_matches_peft(base: Path, adapters: list[Path], tmp_path: Path) -> None:
    """Every prompt under the base and each adapter, interleaved in one engine (each step mixes them), against
    transformers + peft one prompt at a time."""
    prompts = family_prompts()[:6]
    want = {"base": hf_reference(_without_adapters(base), prompts)}
    for folder in adapters:
        want[folder.name] = hf_reference(peft_model(base, folder), prompts)
    for folder in adapters:  # else a test of the adapters would pass with them ignored
        assert _differ(want[folder.name], want["base"]), f"{folder.name} changes neither tokens nor logprobs"
    engine = fresh_engine(base, tmp_path / "cache")
    logprobs = record_logprobs(engine)
    names = ["base"] + [f.name for f in adapters]
    loras = {"base": None} | {f.name: lora(f, i + 1) for i, f in enumerate(adapters)}
    requests = [GenerationRequest(f"{name}-{i}", p, PARAMS, lora_request=loras[name])
                for i, p in enumerate(prompts) for name in names]
    results = {r.request_id: r for r in engine.generate(requests)}
    for name in names:
        mine = [results[f"{name}-{i}"] for i in range(len(prompts))]
        assert_exact(mine, logprobs, *want[name], name)


def _differ(one: tuple[list, list], other: tuple[list, list]) -> bool:
    """Greedy tokens differ, or their logprobs by more than a hundred times the tolerance."""
    gaps = [abs(a - b) for lps, ops in zip(one[1], other[1]) for a, b in zip(lps, ops)]
    return one[0] != other[0] or max(gaps) > 100 * LOGPROB_TOLERANCE


def _without_adapters(base: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager").eval()


def test_a_row_does_not_depend_on_the_adapters_sharing_its_step(family, tmp_path):
    """Bitwise: each request alone (an engine of its own, no cache) against all of them mixed in one step."""
    base, adapters = family
    prompts = family_prompts()
    models = [None, lora(adapters[0], 1), lora(adapters[1], 2)]
    requests = [GenerationRequest(f"r{i}", p, PARAMS, lora_request=models[i % 3]) for i, p in enumerate(prompts)]
    mixed = fresh_engine(base, tmp_path / "cache", enable_prefix_caching=False)
    mixed_logprobs = record_logprobs(mixed)
    together = mixed.generate(requests)
    for req, got in zip(requests, together):
        single = fresh_engine(base, tmp_path / "cache", enable_prefix_caching=False)
        single_logprobs = record_logprobs(single)
        alone = single.generate([req])[0]
        assert got.output_token_ids == alone.output_token_ids, req.request_id
        assert mixed_logprobs[req.request_id] == single_logprobs[req.request_id], f"{req.request_id}: not bitwise"


def test_the_prefix_cache_never_serves_one_adapters_kv_to_another(family, tmp_path):
    base, adapters = family
    prompt = family_prompts()[5]  # 70 tokens: four full blocks
    first, second = lora(adapters[0], 1), lora(adapters[1], 2)
    engine = fresh_engine(base, tmp_path / "cache")
    warm = engine.generate([GenerationRequest("first", prompt, PARAMS, lora_request=first)])[0]
    other = engine.generate([GenerationRequest("second", prompt, PARAMS, lora_request=second)])[0]
    again = engine.generate([GenerationRequest("again", prompt, PARAMS, lora_request=first)])[0]
    base_run = engine.generate([GenerationRequest("base", prompt, PARAMS)])[0]
    assert other.cached_tokens == 0 and base_run.cached_tokens == 0, "another adapter's blocks were served"
    assert again.cached_tokens >= 64 and again.output_token_ids == warm.output_token_ids
    cold = fresh_engine(base, tmp_path / "cache").generate([GenerationRequest("cold", prompt, PARAMS, lora_request=second)])
    assert other.output_token_ids == cold[0].output_token_ids


def test_adapters_past_max_loras_are_evicted_least_recently_used(family, tmp_path):
    base, adapters = family
    prompts = family_prompts()[:4]
    models = [lora(adapters[0], 1), lora(adapters[1], 2)]
    requests = [GenerationRequest(f"r{i}-{j}", p, PARAMS, lora_request=m)
                for i, p in enumerate(prompts) for j, m in enumerate(models)]
    roomy = {r.request_id: r.output_token_ids for r in fresh_engine(base, tmp_path / "cache").generate(requests)}
    tight = fresh_engine(base, tmp_path / "cache", max_loras=1)
    per_step: list[int] = []
    prepare = tight.runner.prepare_lora

    def counted(seqs):  # how many distinct adapters each step runs: the scheduler keeps it within max_loras
        per_step.append(len({s.lora_int_id for s in seqs if s.lora_request is not None}))
        return prepare(seqs)

    tight.runner.prepare_lora = counted  # type: ignore[method-assign]
    got = {r.request_id: r.output_token_ids for r in tight.generate(requests)}
    assert got == roomy
    assert max(per_step) == 1 and len(tight.runner.lora.loaded) == 1 and tight.runner.lora.num_loads >= 2


def test_an_adapter_of_another_base_is_refused_in_one_line(family, tmp_path):
    base, adapters = family
    other = build_family_checkpoint("llama", tmp_path / "other", hidden_size=32, intermediate_size=48)
    stranger = build_adapter(other, tmp_path / "stranger", 4, ["q_proj"], seed=3)
    broken = tmp_path / "broken"
    shutil.copytree(adapters[0], broken)
    (broken / "adapter_model.safetensors").unlink()
    engine = fresh_engine(base, tmp_path / "cache")
    results = engine.generate([GenerationRequest("fine", [5, 6, 7], PARAMS, lora_request=lora(adapters[0], 1)),
                               GenerationRequest("stranger", [5, 6, 7], PARAMS, lora_request=lora(stranger, 2)),
                               GenerationRequest("broken", [5, 6, 7], PARAMS, lora_request=lora(broken, 3))])
    assert results[0].ok
    assert results[1].error is not None and "do not fit the base" in results[1].error
    assert results[2].error is not None and "no adapter_model.safetensors" in results[2].error
    assert all("\n" not in r.error for r in results[1:] if r.error)


@needs_kernel
def test_adapters_over_gguf_blocks_are_close_to_peft_and_batch_invariant(tmp_path):
    """The base in Q8_0 blocks (int8 activations), the adapter's delta in float32 beside it: close to transformers +
    peft by vLLM's rule (top 5, as the GGUF families' test), and each row bitwise the same alone."""
    folder, path = checkpoint_and_gguf("llama", tmp_path)
    adapter = lora(build_adapter(folder, tmp_path / "adapter1", 8, ALL_LINEAR, seed=1), 1)
    prompts = family_prompts()[:6]
    want_tokens, want_top = hf_reference(peft_model(folder, Path(adapter.lora_path)), prompts, top=5)
    engine = gguf_engine(path, tmp_path)
    assert engine.config.weight_format == "gguf"
    top = record_logprobs(engine, top=5)
    requests = [GenerationRequest(f"{kind}{i}", p, PARAMS, lora_request=adapter if kind == "a" else None)
                for i, p in enumerate(prompts) for kind in "ab"]
    results = {r.request_id: r for r in engine.generate(requests)}
    for i in range(len(prompts)):
        got = results[f"a{i}"]
        check_logprobs_close(got.output_token_ids, top[f"a{i}"], want_tokens[i], want_top[i], got.request_id)
    assert any(results[f"a{i}"].output_token_ids != results[f"b{i}"].output_token_ids for i in range(len(prompts)))
    for req in requests[:4]:
        single = gguf_engine(path, tmp_path)
        single_top = record_logprobs(single, top=5)
        assert single.generate([req])[0].output_token_ids == results[req.request_id].output_token_ids
        assert single_top[req.request_id] == top[req.request_id], f"{req.request_id}: not bitwise"


def test_the_transformers_reference_refuses_an_adapter_line_rather_than_answer_as_the_base(tmp_path):
    from batchinfer.runtime.hf_generate import HFGenerator

    base = build_family_checkpoint("llama", tmp_path / "base")
    generator = HFGenerator.from_pretrained(str(base), str(tmp_path / "cache"))
    tuned = LoRARequest("tuned", 1, str(tmp_path / "anywhere"))
    refused, fine = generator.generate([GenerationRequest("tuned", [5, 6, 7], PARAMS, lora_request=tuned),
                                        GenerationRequest("base", [5, 6, 7], PARAMS)])
    assert refused.error is not None and "runs no LoRA adapters" in refused.error
    assert fine.ok and len(fine.output_token_ids) == MAX_NEW_TOKENS
