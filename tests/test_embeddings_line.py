"""`/v1/embeddings` lines: what validation accepts and refuses, and the output body the openai SDK parses."""
import base64
import io
import json
import math
import struct

import pytest
from openai.types import CreateEmbeddingResponse

from batchinfer.engine.types import GenerationResult
from batchinfer.jobs.endpoints import batch_line as formats
from batchinfer.jobs.intake.lines import ValidationLimits, validate_stream
from jobfiles import chat_line

MODEL = "smollm2-135m-instruct"
pytestmark = pytest.mark.fast  # a tiny real tokenizer (tests/tiny_model.py), no model


def embedding_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": MODEL, **body}})


def _validate(tokenizer, lines: list[str], endpoint: str | None = "/v1/embeddings"):
    valid, invalid = [], []
    limits = ValidationLimits(model_id=MODEL, max_model_len=64, endpoint=endpoint)
    report = validate_stream(io.BytesIO(("\n".join(lines) + "\n").encode()), tokenizer, limits, valid.append,
                             invalid.append)
    return report, valid, invalid


def test_every_input_form_is_tokenized_without_a_template(tiny_tokenizer):
    ids = tiny_tokenizer.encode("Hello world", add_special_tokens=False)
    report, valid, _ = _validate(tiny_tokenizer, [
        embedding_line("s", input="Hello world"), embedding_line("l", input=["Hello world", "Bye"], dimensions=8),
        embedding_line("t", input=ids), embedding_line("tt", input=[ids, ids[:1]], encoding_format="base64")])
    assert report.ok
    assert [v.request.prompt_token_ids for v in valid] == [ids] * 4
    assert all(v.request.sampling.embed for v in valid)
    assert valid[1].request.echo == {"encoding_format": "float", "dimensions": 8,
                             "inputs": [ids, tiny_tokenizer.encode("Bye", add_special_tokens=False)]}
    assert "inputs" not in valid[0].request.echo and valid[3].request.echo["inputs"] == [ids, ids[:1]]


@pytest.mark.parametrize("body, code, param, per_request", [
    ({"input": ""}, "invalid_value", "body.input", True),
    ({"input": []}, "invalid_value", "body.input", True),
    ({"input": [10**9]}, "invalid_value", "body.input", True),
    ({"input": "word " * 100}, "context_length_exceeded", "body.input", True),
    ({"input": "x", "encoding_format": "int8"}, "invalid_value", "body.encoding_format", True),
    ({"input": "x", "dimensions": 0}, "integer_below_min_value", "body.dimensions", True),
    ({}, "invalid_request", "body.input", False),  # OpenAI checks the prompt field at validation: the batch fails
])
def test_bad_embedding_lines_get_their_codes(tiny_tokenizer, body, code, param, per_request):
    report, valid, invalid = _validate(tiny_tokenizer, [embedding_line("ok", input="x"), embedding_line("bad", **body)])
    assert [v.custom_id for v in valid] == ["ok"]
    (error,) = invalid
    assert (error.custom_id, error.code, error.param, error.per_request) == ("bad", code, param, per_request)


def test_an_embeddings_batch_holds_only_embedding_lines(tiny_tokenizer):
    _, valid, invalid = _validate(tiny_tokenizer, [embedding_line("e", input="x"), chat_line("c", "Hi")])
    assert [v.custom_id for v in valid] == ["e"] and [(e.custom_id, e.code) for e in invalid] == [("c", "invalid_url")]
    _, valid, invalid = _validate(tiny_tokenizer, [embedding_line("e", input="x"), chat_line("c", "Hi")],
                                  endpoint="/v1/chat/completions")
    assert [v.custom_id for v in valid] == ["c"] and [(e.custom_id, e.code) for e in invalid] == [("e", "invalid_url")]


def _result(vector: list[float], prompt_tokens: int) -> GenerationResult:
    return GenerationResult("r", [], "", "stop", prompt_tokens, 0, 1.0, 1.0, 1.0, 1.0, embedding=vector)


def test_the_output_is_a_list_of_embeddings_with_dimensions_and_base64():
    a, b = [0.6, 0.0, 0.8, 0.0], [0.0, 1.0, 0.0, 0.0]
    line = formats.output_line("batch_x", 0, "c", "/v1/embeddings", MODEL, [_result(a, 3), _result(b, 2)], "w",
                                          {"encoding_format": "float", "dimensions": 2})
    parsed = CreateEmbeddingResponse.model_validate(line["response"]["body"])
    assert parsed.object == "list" and [d.index for d in parsed.data] == [0, 1]
    assert parsed.data[0].embedding == [1.0, 0.0] and parsed.data[1].embedding == [0.0, 1.0]  # cut, then normalized
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == 5
    line = formats.output_line("batch_x", 0, "c", "/v1/embeddings", MODEL, [_result(a, 3)], "w", {"encoding_format": "base64"})
    raw = base64.b64decode(line["response"]["body"]["data"][0]["embedding"])
    assert all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(struct.unpack("<4f", raw), a))
