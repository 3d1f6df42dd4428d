"""The batch-invariance workload: 24 prompts of mixed lengths (two groups share a long prefix), each asked
greedy and seeded, run in the arrangements issue 20 names. Each arrangement maps a request's key to its
tokens and the bitwise (hex) logprob of each, so arrangements compare exactly.

Also a script: `python -m tests.engine.invariance_cases DTYPE OUT.json [WEIGHT_FORMAT]` runs the 64-request
batch in this process and writes its outputs (the two-process case), and `--report DTYPE [WEIGHT_FORMAT]` prints,
per arrangement, how many requests match their run alone (the figures of the issue's note, before and after a
change). WEIGHT_FORMAT "dense" (the default) runs transformers' load, "gguf" the GGUF's own blocks (load_model).
"""
from __future__ import annotations

import json
import sys

from batchinfer.engine import EngineConfig, LLMEngine
from batchinfer.engine.types import GenerationRequest, SamplingParams

MAX_TOKENS = 3  # a prefill and two decodes: enough to see both kinds of step
KV_BYTES = 64 << 20
LONG_PREFIX = ("Invoice 4471 from Northwind Traders lists forty crates of green tea, twelve boxes of ceramic mugs and "
               "a delivery charge. Payment is due within thirty days. The customer asked for the crates to be split "
               "across two warehouses, one in Lyon and one in Porto. Question: ")  # > 64 tokens: over a chunk
FEW_SHOT = ("Classify each review as positive, negative or neutral.\nReview: Cold soup. Sentiment: negative\n"
            "Review: Best pizza in years! Sentiment: positive\nReview: ")
QUESTIONS = ["Who is the supplier?", "When is payment due?", "Which cities are mentioned?", "What went wrong?",
             "Is a deposit needed?", "How many crates?", "Summarise it.", "What is sold?"]
REVIEWS = ["Lovely staff.", "It broke after two days.", "Arrived on time.", "Awful, never again.",
           "Great value!", "Long film, good ending.", "Meh.", "Fantastic concert."]
SINGLES = ["hi", "What is 17 times 3?", "Write a haiku about autumn.", "Name three colours.",
           "Translate 'good morning' into French.", "Explain a hash table to a child, covering buckets and "
           "collisions.", "Tell me a joke.", "List the planets in order from the sun."]


def prompts(tokenizer) -> list[list[int]]:
    texts = [LONG_PREFIX + q for q in QUESTIONS] + [FEW_SHOT + r + " Sentiment:" for r in REVIEWS] + SINGLES
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def requests(tokenizer) -> list[GenerationRequest]:
    """24: every prompt once, greedy and seeded in turn (each group has both), reporting the sampled token's
    logprob."""
    out = []
    for i, ids in enumerate(prompts(tokenizer)):
        if i % 2 == 0:
            out.append(GenerationRequest(f"greedy-{i}", ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                              logprobs=0)))
        else:
            out.append(GenerationRequest(f"seeded-{i}", ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9,
                                                                              seed=100 + i, logprobs=0)))
    return out


def fillers(tokenizer) -> list[GenerationRequest]:
    """40 unrelated unseeded requests of other lengths, to make the batch 64."""
    text = "Once upon a time in a small village by the sea there lived an old fisherman who"
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [GenerationRequest(f"filler-{i}", ids[:3 + i % 16], SamplingParams(max_tokens=1 + i % 5, temperature=1.0))
            for i in range(40)]


def engine(loaded, dtype: str, prefix_caching: bool = False, kv_bytes: int = KV_BYTES, block_size: int = 16,
           device: str = "cpu") -> LLMEngine:
    return LLMEngine(loaded, EngineConfig(dtype=dtype, enable_prefix_caching=prefix_caching, kv_cache_bytes=kv_bytes,
                                          block_size=block_size, device=device))


def outputs(results) -> dict[str, tuple[list[int], list[str]]]:
    return {r.request_id: (r.output_token_ids, [float(e.logprob).hex() for e in r.logprobs])
            for r in results if not r.request_id.startswith("filler")}


def alone(eng: LLMEngine, reqs: list[GenerationRequest]) -> dict:
    found: dict = {}
    for req in reqs:
        found |= outputs(eng.generate([req]))
    return found


def mixed_batch(eng: LLMEngine, reqs: list[GenerationRequest], extra: list[GenerationRequest]) -> dict:
    """The 24 with the 40 fillers spread among them: 64 in one generate call."""
    batch = list(reqs)
    for i, f in enumerate(extra):
        batch.insert(min(2 * i, len(batch)), f)
    return outputs(eng.generate(batch))


def arrangements(loaded, dtype: str, device: str = "cpu") -> dict[str, dict]:
    """Every in-process arrangement; "alone" (each request by itself, nothing cached) is the reference."""
    tok = loaded.tokenizer
    reqs, extra = requests(tok), fillers(tok)
    cold = engine(loaded, dtype, device=device)
    found = {"alone": alone(cold, reqs), "batch of 64": mixed_batch(cold, reqs, extra),
             "reverse order": mixed_batch(cold, reqs[::-1], extra[::-1])}
    warm = engine(loaded, dtype, prefix_caching=True, device=device)
    found["prefix cache cold"] = mixed_batch(warm, reqs, extra)
    found["prefix cache warm"] = mixed_batch(warm, reqs[::-1], extra)
    # Blocks of 4 tokens, so decodes keep needing new ones (with 16 and 3 tokens out none of these prompts
    # crosses a block), and 24 of them: about one long prompt's worth.
    small = engine(loaded, dtype, prefix_caching=True, kv_bytes=_kv_bytes_for_blocks(loaded, dtype, 24, 4), block_size=4,
                   device=device)
    found["preempted (small KV budget)"] = mixed_batch(small, reqs, extra)
    found["preemptions"] = {"count": small.num_preemptions}
    return found


def _kv_bytes_for_blocks(loaded, dtype: str, blocks: int, block_size: int) -> int:
    from batchinfer.engine.runner.model_runner import kv_bytes_per_block
    return blocks * kv_bytes_per_block(loaded.hf_model.config, EngineConfig(dtype=dtype, block_size=block_size))


def report(found: dict[str, dict]) -> dict[str, str]:
    ref = found["alone"]
    lines = {}
    for name, got in found.items():
        if name in ("alone", "preemptions"):
            continue
        same = sum(got.get(k) == v for k, v in ref.items())
        tokens = sum(got.get(k, (None,))[0] == v[0] for k, v in ref.items())
        lines[name] = f"{same}/{len(ref)} bitwise (tokens {tokens}/{len(ref)})"
    return lines


def load(weight_format: str = "dense"):
    """The model an arrangement runs: transformers' load (dense), or the light load with the GGUF's blocks."""
    import torch

    from batchinfer.engine.loading.loader import load_model, load_model_light
    from tests.engine.conftest import model_cache_dir
    if weight_format == "dense":
        return load_model(None, model_cache_dir())
    return load_model_light(None, model_cache_dir(), torch.float32, weight_format)


def main(argv: list[str]) -> None:
    if argv[0] == "--report":
        found = arrangements(load(*argv[2:]), argv[1])
        print(json.dumps({"preemptions": found["preemptions"]["count"]} | report(found), indent=1))
        return
    dtype, path, *weight_format = argv
    loaded = load(*weight_format)
    with open(path, "w") as f:
        json.dump(mixed_batch(engine(loaded, dtype), requests(loaded.tokenizer), fillers(loaded.tokenizer)), f)


if __name__ == "__main__":
    main(sys.argv[1:])
