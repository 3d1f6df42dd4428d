"""A labelling workload over four JSON schemas (enums, a nested object, an array, required fields): the test of
structured outputs through the job system and `batchinfer bench constrained` run the same lines."""
from __future__ import annotations

import json

MODEL = "smollm2-135m-instruct"
SCHEMAS: dict[str, dict] = {
    "sentiment": {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
                  "required": ["label"], "additionalProperties": False},
    "entity": {"type": "object", "properties": {"entity": {
        "type": "object", "properties": {"kind": {"enum": ["person", "place", "thing"]}, "named": {"type": "boolean"}},
        "required": ["kind", "named"], "additionalProperties": False}},
        "required": ["entity"], "additionalProperties": False},
    "topics": {"type": "object", "properties": {"topics": {"type": "array", "items": {"enum": ["food", "travel", "work"]},
                                                           "minItems": 1, "maxItems": 2}},
               "required": ["topics"], "additionalProperties": False},
    "rating": {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                                                "urgent": {"type": "boolean"}},
               "required": ["score", "urgent"], "additionalProperties": False},
}
SUBJECTS = ["The hotel", "My flight", "Anna from Porto", "The soup", "The Friday meeting", "This pizza", "The train",
            "Our new manager", "The museum", "The delivery"]
VERDICTS = ["was wonderful.", "was late again.", "was fine, nothing special.", "made me angry.", "surprised us all."]


def texts(count: int) -> list[str]:
    """count short texts (50 distinct, then again)."""
    pool = [f"{s} {v}" for s in SUBJECTS for v in VERDICTS]
    return [pool[i % len(pool)] for i in range(count)]


def schema_of(custom_id: str) -> dict:
    return SCHEMAS[custom_id.rsplit("-", 1)[0]]


def messages(schema_name: str, text: str) -> list[dict]:
    """The schema in a system message (shared by every line of the schema: one cached prefix), the text after."""
    ask = f"Answer only with JSON matching this schema: {json.dumps(SCHEMAS[schema_name])}"
    return [{"role": "system", "content": ask}, {"role": "user", "content": text}]


def response_format(schema_name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": schema_name, "schema": SCHEMAS[schema_name], "strict": True}}


def batch_lines(per_schema: int, max_tokens: int, constrained: bool) -> list[str]:
    """per_schema lines for each schema, greedy; with response_format when constrained (the control without)."""
    out = []
    for name in SCHEMAS:
        for i, text in enumerate(texts(per_schema)):
            body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": messages(name, text)}
            if constrained:
                body["response_format"] = response_format(name)
            out.append(json.dumps({"custom_id": f"{name}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                   "body": body}))
    return out


def validates(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
