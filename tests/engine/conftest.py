"""Shared fixtures for the engine tests: the real model, real chat prompts, and one transformers
greedy reference computed once per session."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from batchinfer.engine.loading.loader import LoadedModel, load_model

MAX_NEW_TOKENS = 12


def model_cache_dir() -> str:
    return os.environ.get("BATCHINFER_MODEL_CACHE") or str(Path.home() / ".cache" / "batchinfer" / "models")


@pytest.fixture(scope="session")
def loaded_model() -> LoadedModel:
    return load_model(None, model_cache_dir())


@pytest.fixture(scope="session")
def gguf_model() -> LoadedModel:
    """The model in the GGUF's own Q4_1/Q8_0 blocks (weight_format gguf, what auto runs on an AVX2 CPU)."""
    from batchinfer.engine.loading.loader import load_model_light
    from batchinfer.engine.quant.kernel import supported

    if not supported():
        pytest.skip("the integer kernel needs AVX2, FMA and F16C; this CPU lacks one")
    return load_model_light(None, model_cache_dir(), torch.float32, "gguf")


DOCUMENT = (
    "Invoice 4471 from Northwind Traders lists forty crates of green tea, twelve boxes of ceramic mugs and "
    "a delivery charge. Payment is due within thirty days. The customer asked for the crates to be split across "
    "two warehouses, one in Lyon and one in Porto, and requested that the mugs be wrapped individually because a "
    "previous shipment arrived broken. The account manager noted that the customer has paid late twice this year "
    "and suggested a small deposit before dispatch. The warehouse in Porto confirmed it has space for twenty crates. "
    "Lyon asked for the delivery to arrive before the holiday closure on the twentieth, and the carrier quoted two "
    "options: a slower road freight at a lower price, or an express service that costs almost twice as much but "
    "guarantees arrival within four working days. Finance prefers the road freight unless the customer pays the "
    "difference. The sales team wants to keep the customer happy because a larger order for the spring season is "
    "being negotiated, worth roughly five times this invoice."
)
FEW_SHOT = (
    "Classify the sentiment of each review as positive, negative or neutral.\n"
    "Review: The soup was cold and the waiter ignored us. Sentiment: negative\n"
    "Review: Decent coffee, nothing special. Sentiment: neutral\n"
    "Review: Best pizza I have had in years! Sentiment: positive\n"
)


def _chat_prompts() -> list[list[dict]]:
    doc_questions = ["Who is the supplier?", "When is payment due?", "Which cities are mentioned?",
                     "What went wrong with the previous shipment?", "Should a deposit be asked for? Answer yes or no.",
                     "How many crates fit in Porto?", "Summarise the invoice in one line.", "What is being sold?"]
    reviews = ["The staff were lovely and the room was spotless.", "It broke after two days.",
               "Arrived on time.", "I would never come back here again, awful.", "Great value for money!",
               "The film was long but the ending made it worth it.", "Meh.", "Absolutely fantastic concert."]
    singles = ["hi", "What is 17 times 3?", "Write a haiku about autumn leaves.", "Name three primary colours.",
               "Translate 'good morning' into French.", "Explain what a hash table is to a child, in detail, "
               "covering buckets, collisions and why lookups are fast on average.", "Tell me a joke.",
               "List the planets of the solar system in order from the sun."]
    prompts = [[{"role": "system", "content": DOCUMENT}, {"role": "user", "content": q}] for q in doc_questions]
    prompts += [[{"role": "user", "content": FEW_SHOT + f"Review: {r} Sentiment:"}] for r in reviews]
    prompts += [[{"role": "user", "content": s}] for s in singles]
    return prompts


@pytest.fixture(scope="session")
def chat_prompts() -> list[list[dict]]:
    return _chat_prompts()


@pytest.fixture(scope="session")
def prompt_token_ids(loaded_model) -> list[list[int]]:
    tok = loaded_model.tokenizer
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in _chat_prompts()]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@dataclass
class Reference:
    tokens: list[int]
    top2_gaps: list[float]  # top-1 minus top-2 logit at each generated step


@pytest.fixture(scope="session")
def hf_reference(loaded_model, prompt_token_ids, tmp_path_factory) -> list[Reference]:
    """transformers generate(), greedy, one prompt at a time (no padding). Under pytest-xdist the first process
    to need it computes it and the others read its file (about 25 s each saved)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _hf_reference(loaded_model, prompt_token_ids)
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "hf_reference.json"
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            refs = _hf_reference(loaded_model, prompt_token_ids)
            shared.write_text(json.dumps([[r.tokens, r.top2_gaps] for r in refs]))
        return [Reference(tokens, gaps) for tokens, gaps in json.loads(shared.read_text())]


def _hf_reference(loaded_model, prompt_token_ids) -> list[Reference]:
    refs = []
    with torch.inference_mode():
        for ids in prompt_token_ids:
            x = torch.tensor([ids])
            out = loaded_model.hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW_TOKENS,
                                                 do_sample=False, output_logits=True, return_dict_in_generate=True)
            gaps = [float(t[0] - t[1]) for t in (torch.topk(step[0].float(), 2).values for step in out.logits)]
            refs.append(Reference(out.sequences[0, len(ids):].tolist(), gaps))
    return refs
