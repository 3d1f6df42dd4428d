import io
import json
from pathlib import Path

import pytest

from batchinfer.engine.types import SamplingParams
from batchinfer.jobs.intake.lines import CODES, ValidationLimits, validate_stream
from jobfiles import chat_line, completion_line

MODEL = "smollm2-135m-instruct"
pytestmark = pytest.mark.fast  # a tiny real tokenizer (tests/tiny_model.py), no model


def _limits(**overrides):
    return ValidationLimits(**{"model_id": MODEL, "max_model_len": 8192, **overrides})


def _validate(tokenizer, data: bytes, **limits):
    valid, invalid = [], []
    report = validate_stream(io.BytesIO(data), tokenizer, _limits(**limits), valid.append, invalid.append)
    return report, valid, invalid


def _codes(report):
    """The problems that fail the batch (of the file and of lines' envelopes)."""
    return [(e.line, e.code, e.param) for e in report.errors]


def _refused(report):
    """The bodies the endpoint refuses: each its request's own 400, while the rest runs."""
    return [(e.line, e.code, e.param) for e in report.request_errors]


def test_a_good_file_is_tokenized_with_the_chat_template(tiny_tokenizer):
    data = "\n".join([chat_line("a", "Hello", 3), "", completion_line("b", "Once upon", 4, stop="x")]).encode()
    report, valid, _ = _validate(tiny_tokenizer, data + b"\n")
    assert report.ok and report.lines == 2 and [v.line for v in valid] == [1, 3]
    chat = valid[0]
    assert chat.request.prompt_token_ids[0] == 1  # <|im_start|>
    assert tiny_tokenizer.decode(chat.request.prompt_token_ids).endswith("<|im_start|>assistant\n")
    assert valid[1].request.prompt_token_ids == tiny_tokenizer.encode("Once upon", add_special_tokens=False)
    assert valid[1].request.sampling == SamplingParams(max_tokens=4, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                                                       stop=("x",))
    assert [v.request.index for v in valid] == [0, 1]


def test_the_shipped_sample_is_valid(tiny_tokenizer):
    with open(Path(__file__).parents[1] / "examples" / "sample.jsonl", "rb") as f:
        report, valid, _ = _validate(tiny_tokenizer, f.read())
    urls = {v.request.url for v in valid}
    assert report.ok and len(valid) == 8 and urls == {"/v1/chat/completions", "/v1/completions"}


def test_every_line_problem_is_reported_with_line_code_and_param_split_as_openai_does(tiny_tokenizer):
    lines = [
        chat_line("ok-1", "fine"),                                                         # 1
        "{not json",                                                                       # 2
        "[1, 2]",                                                                          # 3
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),              # 4 missing custom_id
        chat_line("ok-1", "dup"),                                                          # 5
        json.dumps({"custom_id": "u", "method": "POST", "url": "/v1/moderations", "body": {}}),  # 6
        chat_line("m", "hi", model="gpt-4o"),                                              # 7
        chat_line("t", "hi", temperature=5),                                               # 8
        completion_line("long", "hello " * 100, max_tokens=8150),                          # 9
        json.dumps({"custom_id": "nomsg", "method": "POST", "url": "/v1/chat/completions", "body": {}}),  # 10
        completion_line("mt", "hi", max_tokens=0),                                         # 11
    ]
    data = "\n".join(lines).encode() + b"\n\xff\xfe bad bytes\n"                           # 12
    report, valid, invalid = _validate(tiny_tokenizer, data)
    assert _codes(report) == [
        (2, "invalid_json_line", None), (3, "invalid_request", None), (4, "missing_required_parameter", "custom_id"),
        (5, "duplicate_custom_id", "custom_id"), (6, "invalid_url", "url"), (7, "model_not_found", "body.model"),
        (10, "invalid_request", "body.messages"), (12, "invalid_json_line", None)]
    assert _refused(report) == [(8, "decimal_above_max_value", "body.temperature"),
                                (9, "context_length_exceeded", "body.prompt"),
                                (11, "integer_below_min_value", "body.max_tokens")]
    assert [v.custom_id for v in valid] == ["ok-1"]
    assert [e.line for e in invalid] == list(range(2, 13))
    assert [e.line for e in invalid if e.per_request] == [8, 9, 11]
    assert report.error_count == 8 and report.refused == 3 and not report.ok and not report.file_error


def test_openai_wording_of_each_problem(tiny_tokenizer):
    lines = [json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
             json.dumps({"custom_id": "s", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}}),
             json.dumps({"custom_id": "m", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "nope"}}),
             json.dumps({"custom_id": "r", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": MODEL, "messages": [{"content": "no role"}]}}),
             chat_line("t", "hi", temperature="hot"), chat_line("tools", "hi", tools=[{"type": "function"}])]
    report, _, _ = _validate(tiny_tokenizer, "\n".join(lines).encode())
    assert [e.message for e in report.errors] == [
        "Missing required parameter: 'custom_id'.",
        "Chat Completions: Streaming is not supported in the Batch API.",
        "The provided model 'nope' is not supported by the Batch API (served here: 'smollm2-135m-instruct')."]
    assert [(e.code, e.message) for e in report.request_errors] == [
        ("missing_required_parameter", "Missing required parameter: 'messages[0].role'."),
        ("invalid_type", "Invalid type for 'temperature': expected a number, but got a string instead."),
        ("invalid_value", "Invalid value for 'tools': tool 0: each tool must be {\"type\": \"function\", \"function\": "
                          "{\"name\", \"parameters\"}} (got [{'type': 'function'}]).")]


def test_strict_limits_make_a_refused_body_fail_the_batch(tiny_tokenizer):
    data = "\n".join([chat_line("ok", "fine"), chat_line("t", "hi", temperature=5)]).encode()
    report, valid, invalid = _validate(tiny_tokenizer, data, strict=True)
    assert _codes(report) == [(2, "decimal_above_max_value", "body.temperature")] and report.refused == 0
    assert not report.ok and [e.per_request for e in invalid] == [False] and len(valid) == 1


def test_a_batch_made_through_the_api_names_its_model_on_every_line(tiny_tokenizer):
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}})
    report, _, _ = _validate(tiny_tokenizer, line.encode(), endpoint="/v1/completions")
    assert _codes(report) == [(1, "invalid_request", "body.model")]
    assert report.errors[0].message == "Model parameter is required."


def test_lines_naming_a_model_nobody_serves_are_each_named(tiny_tokenizer):
    """Checked on another model's tokenizer: every line naming it is named, and the other problems too."""
    data = "\n".join([chat_line("a", "hi", model="nope"), "{broken", chat_line("b", "hi")]).encode()
    report, valid, _ = _validate(tiny_tokenizer, data, model_id="nope", model_served=False)
    assert _codes(report) == [(1, "model_not_found", "body.model"), (2, "invalid_json_line", None),
                              (3, "model_not_found", "body.model")]


def test_all_problems_on_one_line_are_reported(tiny_tokenizer):
    report, _, invalid = _validate(tiny_tokenizer, chat_line("x", "hi", temperature=-1, top_p=2).encode())
    assert [e.param for e in report.request_errors] == ["body.temperature", "body.top_p"] and len(invalid) == 1
    assert report.refused == 1 and report.ok


def test_empty_file(tiny_tokenizer):
    report, _, _ = _validate(tiny_tokenizer, b"\n  \n")
    assert _codes(report) == [(None, "empty_file", None)] and report.file_error


def test_too_many_requests(tiny_tokenizer):
    data = "\n".join(completion_line(f"c{i}", "hi") for i in range(4)).encode()
    report, valid, _ = _validate(tiny_tokenizer, data, max_requests=3)
    assert _codes(report) == [(4, "too_many_requests", None)] and report.file_error and len(valid) == 3


def test_line_too_long_is_skipped_without_reading_it_whole(tiny_tokenizer):
    data = (completion_line("a", "x" * 500) + "\n" + completion_line("b", "hi")).encode()
    report, valid, _ = _validate(tiny_tokenizer, data, max_line_bytes=200)
    assert _codes(report) == [(1, "line_too_long", None)] and [v.custom_id for v in valid] == ["b"]
    assert valid[0].line == 2


def test_file_too_large(tiny_tokenizer):
    data = "\n".join(completion_line(f"c{i}", "hi") for i in range(10)).encode()
    report, _, _ = _validate(tiny_tokenizer, data, max_file_bytes=300)
    assert report.errors[-1].code == "file_too_large" and report.file_error


def test_only_the_configured_model_is_served(tiny_tokenizer):
    report, valid, _ = _validate(tiny_tokenizer, json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                                                        "body": {"prompt": "hi"}}).encode())
    assert report.ok and valid[0].request.model == MODEL and valid[0].request.sampling.max_tokens == 256


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "robot", "content": "x"}]}, "body.messages[0].role"),
    ({"messages": [{"role": "user"}]}, "body.messages[0].content"),
    ({"messages": "hi"}, "body.messages"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "body.stop"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": "7"}, "body.seed"),
    ({"messages": [{"role": "user", "content": "x"}], "top_k": 1.5}, "body.top_k"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 17}, "body.n"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "body.n"),
    ({"messages": [{"role": "user", "content": "x"}], "n": "2"}, "body.n"),
])
def test_bad_chat_fields_name_the_param(tiny_tokenizer, body, param):
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body})
    report, _, _ = _validate(tiny_tokenizer, line.encode())
    assert report.ok and report.request_errors[0].param == param
    assert report.request_errors[0].code in ("invalid_value", "invalid_type", "missing_required_parameter",
                                             "array_above_max_length", "integer_above_max_value",
                                             "integer_below_min_value")


def test_every_code_is_in_the_one_table():
    from batchinfer import error_codes

    assert set(CODES) <= set(error_codes.TABLE) and "invalid_field" not in CODES


def _line(custom_id="a", **body) -> bytes:
    body = {"messages": [{"role": "user", "content": "x"}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}).encode()


@pytest.mark.parametrize("custom_id,code", [("i" * 513, "string_above_max_length"), ("a\x00b", "invalid_value"),
                                            ("a\ud800b", "invalid_value")])  # over the column, NUL, a lone surrogate
def test_a_custom_id_the_database_cannot_hold_fails_the_batch(tiny_tokenizer, custom_id, code):
    data = b"\n".join([_line("ok-1"), _line(custom_id), _line("i" * 512)])
    report, valid, invalid = _validate(tiny_tokenizer, data)
    assert _codes(report) == [(2, code, "custom_id")] and [v.line for v in valid] == [1, 3]
    assert invalid[0].custom_id is None and len(report.errors[0].message) < 400  # the bad id is not echoed whole


@pytest.mark.parametrize("seed,ok", [(2**63 - 1, True), (-2**63, True), (2**63, True), (2**64 - 1, True),
                                     (-2**63 - 1, False), (2**64, False)])
def test_a_seed_is_valid_exactly_when_the_engine_takes_it(tiny_tokenizer, seed, ok):
    """Validation and the engine share one range (engine.types): what passes here runs, what fails never does."""
    report, valid, _ = _validate(tiny_tokenizer, _line(seed=seed))
    if ok:
        assert report.ok and valid[0].request.sampling.seed == seed
    else:
        code = "integer_below_min_value" if seed < 0 else "integer_above_max_value"
        assert _refused(report) == [(1, code, "body.seed")] and valid == []


def test_a_prompt_with_a_lone_surrogate_is_an_invalid_field_not_a_crash(tiny_tokenizer):
    chat = _line(messages=[{"role": "user", "content": "a\ud800"}])
    completion = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": "\ud800"}}).encode()
    report, _, _ = _validate(tiny_tokenizer, chat + b"\n" + completion)
    assert _refused(report) == [(1, "invalid_value", "body.messages[0].content"), (2, "invalid_value", "body.prompt")]


def test_json_past_the_parser_limits_is_an_invalid_json_line(tiny_tokenizer):
    too_deep, too_many_digits = b"[" * 100_000, b'{"custom_id": ' + b"7" * 5000 + b"}"
    report, _, _ = _validate(tiny_tokenizer, too_deep + b"\n" + too_many_digits)
    assert _codes(report) == [(1, "invalid_json_line", None), (2, "invalid_json_line", None)]


@pytest.mark.parametrize("field", ["custom_id", "method", "url", "body.model", "body.temperature", "body.seed",
                                   "body.messages"])
def test_a_huge_bad_value_is_echoed_as_a_short_excerpt(tiny_tokenizer, field):
    huge = "x" * 500_000
    obj = json.loads(_line())
    parent, _, name = field.rpartition(".")
    (obj["body"] if parent else obj)[name] = huge
    report, _, invalid = _validate(tiny_tokenizer, json.dumps(obj).encode())
    (error,) = report.errors + report.request_errors
    assert error.param == field and 0 < error.message.count("x") <= 200
    assert invalid[0].custom_id in (None, "a")


def test_a_json_error_names_the_character_where_the_line_goes_wrong(tiny_tokenizer):
    whole = chat_line("cut", "Tell me about the sea and the wind over the water, please.")
    cut = whole[:159]  # a line truncated in the middle of the object
    missing_comma = whole.replace('", "method"', '" "method"', 1)
    report, _, _ = _validate(tiny_tokenizer, f"{cut}\n{missing_comma}\n".encode())
    messages = [e.message for e in report.errors]
    assert messages[0].endswith("at character 160: the line ends early (is the object cut short?))."), messages[0]
    column = missing_comma.index('"method"') + 1  # 1-based: where the comma should have been followed
    assert messages[1] == ("This line is not parseable as valid JSON (Expecting ',' delimiter at character "
                           f"{column})."), messages[1]


def test_chunked_validation_reports_exactly_what_line_by_line_validation_does(tiny_tokenizer, monkeypatch):
    """Lines are tokenized a chunk at a time; indexes, error order (the error file is merged by line) and
    duplicate detection stay those of one line at a time, also across chunk edges and a reader-found problem."""
    import batchinfer.jobs.intake.lines as validation

    lines = [chat_line(f"c{i}", f"question {i}", 2) for i in range(40)]
    lines[5] = "{not json"
    lines[11] = chat_line("c3", "a duplicate", 2)
    lines[17] = chat_line("c17", "x " * 300, 2)  # too long for max_line_bytes below: found by the reader
    lines[23] = chat_line("c23", "too long a prompt", 8200)
    lines[31] = json.dumps({"custom_id": "e1", "method": "POST", "url": "/v1/embeddings",
                            "body": {"model": MODEL, "input": "embed me"}})
    data = ("\n".join(lines) + "\n").encode()
    found = []
    for chunk in (1, 7, 256):
        monkeypatch.setattr(validation, "CHUNK_LINES", chunk)
        report, valid, invalid = _validate(tiny_tokenizer, data, max_line_bytes=500)
        found.append(([(v.request.index, v.line, v.custom_id, v.request.prompt_token_ids) for v in valid],
                      [(e.line, e.code) for e in invalid], report.error_count))
    assert found[0] == found[1] == found[2]
    valid, invalid, _ = found[0]
    assert invalid == [(6, "invalid_json_line"), (12, "duplicate_custom_id"), (18, "line_too_long"),
                       (24, "context_length_exceeded")]
    assert [v[0] for v in valid] == list(range(len(lines) - 4))
    assert [v[1] for v in valid if v[2] == "e1"] == [32]  # the embeddings line, prepared apart, in its place
