"""The new line fields (logprobs, penalties, biases, min_tokens, stop_token_ids) from a line to SamplingParams,
their errors, the refused fields, and the logprobs shapes as the openai SDK parses them."""
import io
import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from batchinfer.engine.types import GenerationResult, SamplingParams, TokenLogprob
from batchinfer.jobs.endpoints import batch_line as formats
from batchinfer.jobs.records import PreparedRequest
from batchinfer.jobs.intake.lines import ValidationLimits, ValidLine, validate_stream

pytestmark = pytest.mark.fast  # a tiny real tokenizer (tests/tiny_model.py), no model


def _validate(tokenizer, *bodies, url="/v1/chat/completions"):
    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url,
                         "body": {"messages": [{"role": "user", "content": "x"}], **b} if "chat" in url
                         else {"prompt": "x", **b}}) for i, b in enumerate(bodies)]
    valid: list[ValidLine] = []
    report = validate_stream(io.BytesIO("\n".join(lines).encode()), tokenizer,
                             ValidationLimits(model_id="m", max_model_len=8192), valid.append)
    return report, valid


def test_the_fields_reach_the_sampling_params_and_survive_the_prepared_file(tiny_tokenizer):
    report, valid = _validate(tiny_tokenizer, {"logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5,
                                               "frequency_penalty": -1, "repetition_penalty": 1.2,
                                               "logit_bias": {"5": -100, "7": 2.5}, "min_tokens": 2,
                                               "stop_token_ids": [9], "ignore_eos": True, "max_tokens": 8})
    assert report.ok
    p = valid[0].request.sampling
    assert (p.logprobs, p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (3, 0.5, -1.0, 1.2)
    assert (p.logit_bias, p.min_tokens, p.stop_token_ids, p.ignore_eos) == ({5: -100.0, 7: 2.5}, 2, (9,), True)
    assert PreparedRequest.from_json(valid[0].request.to_json()).sampling == p  # JSON's string keys come back as ids
    _, valid = _validate(tiny_tokenizer, {"logprobs": True}, {})
    assert [v.request.sampling.logprobs for v in valid] == [0, None]
    _, valid = _validate(tiny_tokenizer, {"logprobs": 4}, {"logprobs": 0}, {}, url="/v1/completions")
    assert [v.request.sampling.logprobs for v in valid] == [4, 0, None]


@pytest.mark.parametrize("body,param,code", [
    ({"top_logprobs": 3}, "body.top_logprobs", "invalid_value"),  # without logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, "body.top_logprobs", "integer_above_max_value"),
    ({"logprobs": 2}, "body.logprobs", "invalid_type"),  # chat takes a boolean
    ({"presence_penalty": 3}, "body.presence_penalty", "decimal_above_max_value"),
    ({"frequency_penalty": "1"}, "body.frequency_penalty", "invalid_type"),
    ({"repetition_penalty": 0}, "body.repetition_penalty", "decimal_below_min_value"),
    ({"logit_bias": {"abc": 1}}, "body.logit_bias", "invalid_value"),
    ({"logit_bias": {"5": 101}}, "body.logit_bias", "invalid_value"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "body.logit_bias", "invalid_value"),
    ({"logit_bias": {"99999999": 1}}, "body.logit_bias", "invalid_value"),  # outside the vocabulary
    ({"stop_token_ids": [99999999]}, "body.stop_token_ids", "invalid_value"),
    ({"min_tokens": 9, "max_tokens": 4}, "body.min_tokens", "invalid_value"),
    ({"functions": [{"name": "f"}]}, "body.functions", "unsupported_parameter"),  # the deprecated form of tools
    ({"parallel_tool_calls": True}, "body.parallel_tool_calls", "invalid_value"),  # only with tools
    ({"audio": {"voice": "alloy"}}, "body.audio", "unsupported_parameter"),
    ({"response_format": {"type": "xml"}}, "body.response_format", "invalid_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": 5}}}},
     "body.response_format", "invalid_value"),  # a schema the library cannot compile
    ({"guided_regex": "(", "max_tokens": 4}, "body.guided_regex", "invalid_value"),
    ({"guided_choice": ["a"], "guided_regex": "a+"}, "body.guided_choice", "invalid_value"),
])
def test_a_bad_or_unsupported_field_is_its_request_own_400_naming_it(tiny_tokenizer, body, param, code):
    report, valid = _validate(tiny_tokenizer, body)
    assert not valid and report.ok and report.refused == 1  # the request fails alone: the batch runs the rest
    (error, *_) = report.request_errors
    assert (error.code, error.param) == (code, param)
    assert param.split(".")[-1] in error.message and len(error.message) < 400


def test_an_image_part_is_refused(tiny_tokenizer):
    part = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    report, valid = _validate(tiny_tokenizer, {"messages": [{"role": "user", "content": [part]}]})
    assert not valid and report.request_errors[0].param == "body.messages[0].content"


def _result(logprobs):
    return GenerationResult("r", [1, 2], "Hé!", "stop", 3, 0, 1.0, 1.0, 1.0, 2.0, logprobs=logprobs)


ENTRIES = [TokenLogprob(1, -0.25, ((1, -0.25), (4, -2.0)), b"H\xc3", (b"H\xc3", b"Hi")),
           TokenLogprob(2, -0.5, ((2, -0.5), (5, -1.5)), b"\xa9!", (b"\xa9!", b"?"))]


def test_chat_logprobs_parse_with_the_openai_sdk():
    body = formats.output_line("b", 0, "c", "/v1/chat/completions", "m", [_result(ENTRIES)], "w")["response"]["body"]
    parsed = ChatCompletion.model_validate(body).choices[0].logprobs
    assert parsed is not None and parsed.content is not None
    assert [t.logprob for t in parsed.content] == [-0.25, -0.5]
    assert bytes(sum((t.bytes or [] for t in parsed.content), [])).decode() == "Hé!"  # bytes exact across a split character
    assert [[a.logprob for a in t.top_logprobs] for t in parsed.content] == [[-0.25, -2.0], [-0.5, -1.5]]
    assert parsed.content[0].top_logprobs[1].token == "Hi"


def test_completion_logprobs_parse_with_the_openai_sdk():
    body = formats.output_line("b", 0, "c", "/v1/completions", "m", [_result(ENTRIES)], "w")["response"]["body"]
    parsed = Completion.model_validate(body).choices[0].logprobs
    assert parsed is not None and parsed.token_logprobs == [-0.25, -0.5]
    assert parsed.text_offset == [0, len(parsed.tokens[0])] and parsed.top_logprobs[1] == {"\ufffd!": -0.5, "?": -1.5}


def test_no_logprobs_asked_is_null():
    for url in ("/v1/chat/completions", "/v1/completions"):
        assert formats.output_line("b", 0, "c", url, "m", [_result(None)], "w")["response"]["body"]["choices"][0][
            "logprobs"] is None


def test_sampling_params_defaults_ask_for_nothing():
    assert not SamplingParams().penalized and SamplingParams().logprobs is None


def test_n_reaches_the_sampling_params_and_the_planner_counts_every_sample(tiny_tokenizer):
    report, valid = _validate(tiny_tokenizer, {"n": 4, "max_tokens": 10}, {"max_tokens": 10})
    assert report.ok and [v.request.sampling.n for v in valid] == [4, 1]
    assert PreparedRequest.from_json(valid[0].request.to_json()).sampling.n == 4
    four, one = (v.request.to_pending("b") for v in valid)
    assert four.cost - one.cost == 30 and four.new_tokens == 40  # the prompt once, max_tokens per sample
    _, valid = _validate(tiny_tokenizer, {"n": 16}, url="/v1/completions")
    assert valid[0].request.sampling.n == 16


def _sample(text: str, reason: str, stop_reason=None, tokens=(1, 2)):
    return GenerationResult("r#sampleX", list(tokens), text, reason, 3, 0, 1.0, 1.0, 1.0, 2.0, stop_reason=stop_reason)


def test_n_samples_are_choices_0_to_n_minus_1_and_usage_counts_the_prompt_once():
    samples = [_sample("a", "stop"), _sample("b", "length", tokens=(1, 2, 3)), _sample("c", "stop", "END")]
    merged = GenerationResult("r", [1, 2], "a", "stop", 3, 2, 1.0, 1.0, 1.0, 2.0, samples=samples)
    for url, parse in (("/v1/chat/completions", ChatCompletion), ("/v1/completions", Completion)):
        body = formats.output_line("b", 0, "c", url, "m", [merged], "w")["response"]["body"]
        parsed = parse.model_validate(body)
        assert [c.index for c in parsed.choices] == [0, 1, 2]
        assert [c.finish_reason for c in parsed.choices] == ["stop", "length", "stop"]
        assert [c["stop_reason"] for c in body["choices"]] == [None, None, "END"]
        assert parsed.usage is not None and (parsed.usage.prompt_tokens, parsed.usage.completion_tokens) == (3, 7)
        assert parsed.usage.prompt_tokens_details.cached_tokens == 2
    texts = [c["message"]["content"] for c in
             formats.output_line("b", 0, "c", "/v1/chat/completions", "m", [merged], "w")["response"]["body"]["choices"]]
    assert texts == ["a", "b", "c"]


def test_the_matched_stop_string_becomes_anthropics_stop_sequence():
    from anthropic.types import Message

    from batchinfer.jobs.endpoints.anthropic import message

    def as_message(result):
        body = formats.output_line("b", 0, "c", "/v1/chat/completions", "m", [result], "w")["response"]["body"]
        return Message.model_validate(message(body))

    stopped = as_message(_sample("Count: one", "stop", stop_reason=", two"))
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", ", two")
    eos, cut = as_message(_sample("Hi", "stop")), as_message(_sample("Hi", "length"))
    assert (eos.stop_reason, eos.stop_sequence, cut.stop_reason) == ("end_turn", None, "max_tokens")
    by_token = as_message(_sample("Hi", "stop", stop_reason=7))  # a stop token id is no stop sequence
    assert (by_token.stop_reason, by_token.stop_sequence) == ("end_turn", None)
