"""Grammar-constrained decoding (xgrammar) on the real model: labelling lines over four JSON schemas all validate;
regex and choice constraints. How often the same prompts fail without the constraint is the bench's figure
(`batchinfer bench constrained`), not this test's."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams

SCHEMAS = {
    "label": {"type": "object", "properties": {"label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                                              "reasons": {"type": "array", "items": {"type": "string", "maxLength": 40},
                                                          "maxItems": 2}},
              "required": ["label", "reasons"], "additionalProperties": False},
    "person": {"type": "object", "properties": {"person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}}, "required": ["name", "age"],
        "additionalProperties": False}, "city": {"type": "string", "maxLength": 30}},
        "required": ["person", "city"], "additionalProperties": False},
    "tags": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "enum": ["food", "travel", "work"]},
                                                       "minItems": 1, "maxItems": 3}}, "required": ["tags"],
             "additionalProperties": False},
    "flags": {"type": "object", "properties": {"urgent": {"type": "boolean"}, "score": {"type": "integer", "minimum": 0,
                                                                                         "maximum": 10}},
              "required": ["urgent", "score"], "additionalProperties": False},
}
TEXTS = ["The hotel room was spotless and the staff lovely.", "My flight to Lisbon was delayed five hours.",
         "Anna, 34, moved from Porto to Lyon for a new job.", "The soup was cold and the bill was wrong.",
         "Meeting moved to Friday; please bring the budget.", "Best pizza I have had in years!"]
LINES_PER_SCHEMA = 5


@pytest.fixture(scope="module")
def engine(loaded_model) -> LLMEngine:
    return LLMEngine(loaded_model, EngineConfig(max_num_seqs=32))


def _prompt(engine: LLMEngine, schema_name: str, text: str) -> list[int]:
    ask = f"Read this and answer only with JSON matching the schema {json.dumps(SCHEMAS[schema_name])}.\n\n{text}"
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True,
                                              tokenize=False), add_special_tokens=False)


def _valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_every_completed_constrained_output_validates_against_its_schema(engine):
    cases = [(name, TEXTS[i % len(TEXTS)], seed) for name in SCHEMAS for i, seed in
             zip(range(LINES_PER_SCHEMA), range(LINES_PER_SCHEMA))]
    reqs = []
    for i, (name, text, seed) in enumerate(cases):
        guided = ("json_schema", json.dumps(SCHEMAS[name], sort_keys=True))
        reqs.append(GenerationRequest(f"g{i}", _prompt(engine, name, text),
                                      SamplingParams(max_tokens=96, temperature=0.8, seed=seed, guided=guided)))
    completed = [(r, name) for r, (name, _, _) in zip(engine.generate(reqs), cases) if r.finish_reason == "stop"]
    assert len(completed) > len(cases) // 2  # most finish inside the budget
    for r, name in completed:
        assert _valid(r.text, SCHEMAS[name]), r.text


def test_regex_and_choice_constraints_hold(engine):
    prompt = _prompt(engine, "flags", "Is this urgent? The server is down.")
    choice = engine.generate([GenerationRequest("ch", prompt, SamplingParams(
        max_tokens=10, temperature=1.0, seed=3, guided=("choice", json.dumps(["yes", "no", "maybe later"]))))])[0]
    assert choice.finish_reason == "stop" and choice.text in ("yes", "no", "maybe later")
    regex = engine.generate([GenerationRequest("re", prompt, SamplingParams(
        max_tokens=20, temperature=1.0, seed=4, guided=("regex", r"[0-9]{3}-[a-z]{2,4}")))])[0]
    assert regex.finish_reason == "stop" and re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", regex.text)


def test_a_constrained_row_leaves_its_unconstrained_companions_alone(engine):
    prompt = _prompt(engine, "label", TEXTS[0])
    alone = engine.generate([GenerationRequest("a", prompt, SamplingParams(max_tokens=12, temperature=0))])[0]
    together = engine.generate([
        GenerationRequest("g", prompt, SamplingParams(max_tokens=12, temperature=0, guided=("json_object", ""))),
        GenerationRequest("a", prompt, SamplingParams(max_tokens=12, temperature=0))])
    assert together[1].output_token_ids == alone.output_token_ids
    assert together[0].text.lstrip().startswith("{")


def test_a_grammar_that_cannot_compile_refuses_only_its_request(engine):
    prompt = _prompt(engine, "flags", TEXTS[1])
    bad, good = engine.generate([
        GenerationRequest("bad", prompt, SamplingParams(max_tokens=4, guided=("regex", "("))),
        GenerationRequest("good", prompt, SamplingParams(max_tokens=4, temperature=0))])
    assert bad.finish_reason == "error" and "cannot be compiled" in (bad.error or "") and good.ok


def test_a_schema_over_the_budget_that_skipped_validation_is_refused_at_once(engine):
    """A request built by another caller than validation: the engine checks the budget itself before compiling
    (a schema of arrays 850 deep took ~47 s of compile)."""
    import time

    deep: dict = {"type": "string"}
    for _ in range(850):
        deep = {"type": "array", "items": deep}
    prompt = _prompt(engine, "flags", TEXTS[2])
    deep_request = GenerationRequest("deep", prompt, SamplingParams(max_tokens=4, guided=("json_schema", json.dumps(deep))))
    started = time.perf_counter()
    [alone] = engine.generate([deep_request])
    assert time.perf_counter() - started < 5  # no compile at all
    assert alone.finish_reason == "error" and "more than 64 levels deep" in (alone.error or "")
    bad, good = engine.generate([deep_request, GenerationRequest("good", prompt, SamplingParams(max_tokens=4,
                                                                                                 temperature=0))])
    assert bad.finish_reason == "error" and good.ok


def test_the_engine_keeps_a_bounded_number_of_compiled_grammars(engine, monkeypatch):
    """Distinct schemas past GRAMMARS_KEPT drop the least recently used grammar; the newest still runs."""
    from batchinfer.engine.sampling import grammar

    monkeypatch.setattr(grammar, "GRAMMARS_KEPT", 3)
    prompt = _prompt(engine, "flags", TEXTS[0])
    for i in range(5):
        engine.generate([GenerationRequest(f"c{i}", prompt, SamplingParams(
            max_tokens=4, temperature=0, guided=("choice", json.dumps([f"yes{i}", f"no{i}"]))))])
    assert engine.grammar.kept() == 3
    [out] = engine.generate([GenerationRequest("again", prompt, SamplingParams(
        max_tokens=4, temperature=0, guided=("choice", json.dumps(["yes0", "no0"]))))])
    assert out.text in ("yes0", "no0")
