"""A chat line with tools: checked at submit time (a bad tool refused naming it), rendered as transformers'
apply_chat_template(tools=...) renders it for each family's template (and our generic format for a template without
tools), and its result read back as tool_calls that the openai SDK parses."""
import io
import json
import shutil
from pathlib import Path

import pytest

from batchinfer.engine.loading.light_loader import LightTokenizer
from batchinfer.jobs.endpoints import chat
from batchinfer.jobs.intake.lines import ValidationLimits, validate_stream
from jobfiles import chat_line
from tool_templates import TEMPLATES

pytestmark = pytest.mark.fast

WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Weather in a city, in <celsius> & more",  # tojson must not escape
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris, and 1+2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_current_weather", "arguments": '{"city": "Paris"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}, {"role": "tool", "tool_call_id": "c2", "content": "3"}]


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def family(request, tiny_model, tmp_path_factory):
    folder = Path(shutil.copytree(tiny_model, tmp_path_factory.mktemp("tools") / request.param))
    (folder / "chat_template.jinja").write_text(TEMPLATES[request.param])
    return request.param, folder


def _transformers(folder: Path, messages: list[dict], tools) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                                     tokenize=False)


def _as_transformers_takes_them(messages: list[dict]) -> list[dict]:
    """The conversation as a transformers user writes it: arguments as objects, a tool message naming its function."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out = []
    for m in messages:
        entry = {"role": m["role"], "content": m["content"] or ""}
        if m.get("tool_calls"):
            entry["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}} for c in m["tool_calls"]]
        if m["role"] == "tool":
            entry |= {"tool_call_id": m["tool_call_id"], "name": names[m["tool_call_id"]]}
        out.append(entry)
    return out


def test_the_prompt_is_rendered_as_transformers_renders_it_with_tools(family):
    fmt, folder = family
    messages = CONVERSATION[:2] if fmt == "mistral" else CONVERSATION  # our Mistral template lists tools at the last user turn
    body = chat.ChatBody.model_validate({"messages": messages, "tools": [WEATHER, ADD]})
    ours = body.prompt_text(LightTokenizer(folder))
    assert ours == _transformers(folder, _as_transformers_takes_them(messages), [WEATHER, ADD])
    assert "<celsius> & more" in ours and "get_current_weather" in ours
    assert body.echo(LightTokenizer(folder))["tool_format"] == fmt


def test_a_conversation_with_tool_results_is_rendered_by_the_template(family):
    fmt, folder = family
    ours = chat.ChatBody.model_validate({"messages": CONVERSATION, "tools": [WEATHER, ADD]}).prompt_text(LightTokenizer(folder))
    assert ours == _transformers(folder, _as_transformers_takes_them(CONVERSATION), [WEATHER, ADD])
    assert "sunny" in ours and '"a": 1' in ours


def test_a_template_without_tools_gets_the_generic_format(tiny_tokenizer):
    body = chat.ChatBody.model_validate({"messages": CONVERSATION, "tools": [WEATHER, ADD]})
    prompt = body.prompt_text(tiny_tokenizer)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nYou can call functions.")
    assert '<tool_call>{"name": "get_current_weather", "arguments": {"city": "Paris"}}</tool_call>' in prompt
    # the two results, one user turn
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n3\n</tool_response><|im_end|>" in prompt
    assert body.echo(tiny_tokenizer) == {"tool_format": "generic", "tool_mode": "auto",
                                         "tool_names": ["get_current_weather", "add"], "parallel_tool_calls": True}


def _refused(tiny_tokenizer, **body) -> list[tuple[str, str, str]]:
    errors: list = []
    limits = ValidationLimits(model_id="smollm2-135m-instruct", max_model_len=8192)
    validate_stream(io.BytesIO((chat_line("x", "hi", 8, **body) + "\n").encode()), tiny_tokenizer, limits,
                    lambda v: None, errors.append)
    return [(e.code, e.param, e.message) for e in errors]


@pytest.mark.parametrize("body,param,says", [
    ({"tools": [ADD, {"type": "function", "function": {"name": "my tool"}}]}, "body.tools", "tool 1 ('my tool')"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "nonsense"}}}}}]}, "body.tools", "tool 0 ('f'): function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "body.tools", "tool 0 ('f')"),
    ({"tools": [ADD, ADD]}, "body.tools", "tool 1 ('add'): the name is used"),
    ({"tools": [{"type": "code_interpreter"}]}, "body.tools", "tool 0"),
    ({"tools": []}, "body.tools", "at least one tool"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "sub"}}}, "body.tool_choice", "names no function"),
    ({"tools": [ADD], "tool_choice": "always"}, "body.tool_choice", '"required"'),
    ({"tool_choice": "required"}, "body.tool_choice", "only allowed when tools are given"),
    ({"tools": [ADD], "tool_choice": "required", "response_format": {"type": "json_object"}}, "body.response_format",
     "cannot be combined with 'tool_choice'"),
    ({"messages": [{"role": "tool", "content": "3"}]}, "body.messages[0]", "needs tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "body.messages[0]", "content may be null only"),
])
def test_a_bad_tool_line_is_its_own_400_naming_the_problem(tiny_tokenizer, body, param, says):
    (code, found_param, message), = _refused(tiny_tokenizer, **body)
    assert (code, found_param) == ("invalid_value", param) and says in message, message


def test_an_assistant_message_with_calls_may_leave_its_content_out(tiny_tokenizer):
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]
    messages = [{"role": "user", "content": "1+2"}, {"role": "assistant", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    assert _refused(tiny_tokenizer, messages=messages, tools=[ADD]) == []


def test_required_and_named_choices_hold_the_output_to_a_grammar():
    required = chat.ChatBody.model_validate({"messages": CONVERSATION[1:2], "tools": [WEATHER, ADD], "tool_choice": "required",
                                             "parallel_tool_calls": False})
    schema = json.loads(required.constraint()[1])
    assert schema["type"] == "array" and schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    named = chat.ChatBody.model_validate({"messages": CONVERSATION[1:2], "tools": [WEATHER, ADD],
                                          "tool_choice": {"type": "function", "function": {"name": "add"}}})
    assert json.loads(named.constraint()[1]) == ADD["function"]["parameters"]
    assert chat.ChatBody.model_validate({"messages": CONVERSATION[1:2], "tools": [ADD]}).constraint() is None  # auto


class _Result:
    prompt_tokens, completion_tokens, cached_tokens, last_token_time = 10, 5, 0, 1796582057.0

    def __init__(self, text: str, finish_reason: str = "stop"):
        self.text, self.finish_reason = text, finish_reason


@pytest.mark.parametrize("echo,text,calls,content", [
    ({"tool_format": "hermes", "tool_mode": "auto"}, 'Checking.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}'
     '</tool_call><tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>', 2, "Checking."),
    ({"tool_format": "hermes", "tool_mode": "auto", "parallel_tool_calls": False}, '<tool_call>{"name": "add", "arguments": '
     '{"a": 1, "b": 2}}</tool_call><tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>', 1, None),
    ({"tool_format": "generic", "tool_mode": "required"}, '[{"name": "add", "arguments": {"a": 1, "b": 2}}]', 1, None),
    ({"tool_format": "mistral", "tool_mode": "function:add"}, '{"a": 1, "b": 2}', 1, None),
])
def test_the_openai_sdk_parses_the_tool_calls_of_a_result(echo, text, calls, content):
    from openai.types.chat import ChatCompletion

    body = chat.result_body("abc", "m", _Result(text), {"tool_names": ["add"], **echo})
    parsed = ChatCompletion.model_validate(body).choices[0]
    assert parsed.finish_reason == "tool_calls" and parsed.message.content == content
    assert len(parsed.message.tool_calls) == calls and {c.id for c in parsed.message.tool_calls} == {
        f"call_abc_0_{k}" for k in range(calls)}
    assert json.loads(parsed.message.tool_calls[0].function.arguments) == {"a": 1, "b": 2}


def test_a_call_of_a_function_the_line_did_not_give_is_content():
    echo = {"tool_format": "hermes", "tool_mode": "auto", "tool_names": ["add"]}
    text = '<tool_call>{"name": "rm", "arguments": {"path": "/"}}</tool_call>'
    choice = chat.result_body("abc", "m", _Result(text), echo)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": text} and choice["finish_reason"] == "stop"


def test_tool_choice_none_renders_the_tools_and_reads_no_calls(tiny_tokenizer):
    body = chat.ChatBody.model_validate({"messages": CONVERSATION[1:2], "tools": [ADD], "tool_choice": "none"})
    assert "You can call functions." in body.prompt_text(tiny_tokenizer)
    assert body.constraint() is None and body.echo(tiny_tokenizer) is None
    text = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    assert chat.result_body("abc", "m", _Result(text), body.echo(tiny_tokenizer))["choices"][0]["message"] == {
        "role": "assistant", "content": text}
