"""Tool calls read back from recorded outputs of each family's format, a template's format found from its markers,
and a forced line's JSON read as calls."""
import json

import pytest

from batchinfer.jobs.endpoints.tool_formats import Call, detect, parse, parse_forced
from tool_templates import TEMPLATES
from tiny_model import CHAT_TEMPLATE

pytestmark = pytest.mark.fast

WEATHER = Call("get_current_weather", json.dumps({"city": "Paris", "unit": "celsius"}))
ADD = Call("add", json.dumps({"a": 1, "b": 2}))
RECORDED = {  # (format, output): (content, calls)
    ("hermes", '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
               "</tool_call>"): (None, [WEATHER]),
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris", "unit": '
               '"celsius"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'):
        ("Let me check.", [WEATHER, ADD]),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'): (None, [ADD]),  # cut before its end tag
    ("generic", '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}]</tool_call>'): (None, [ADD]),  # SmolLM2's list
    ("generic", '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'): (None, [ADD]),
    ("llama3_json", '{"name": "get_current_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'):
        (None, [WEATHER]),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "get_current_weather", '
                    '"parameters": {"city": "Paris", "unit": "celsius"}}'): (None, [ADD, WEATHER]),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "get_current_weather", '
                '"arguments": {"city": "Paris", "unit": "celsius"}}]'): (None, [ADD, WEATHER]),
    ("mistral", 'Sure. [TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'): ("Sure.", [ADD]),
    ("mistral", '[{"name": "add", "arguments": {"a": 1, "b": 2}}]'): (None, [ADD]),  # the marker skipped as special
}
NOT_CALLS = [("hermes", "The weather in Paris is sunny."), ("hermes", "<tool_call>{not json}</tool_call>"),
             ("hermes", '<tool_call>{"arguments": {"a": 1}}</tool_call>'),  # no name
             ("llama3_json", "Paris is sunny."), ("llama3_json", '{"name": "add", "parameters": {"a": 1}} and more'),
             ("mistral", "[TOOL_CALLS][{broken"), ("generic", '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>')]


@pytest.mark.parametrize("fmt,text", sorted(RECORDED))
def test_calls_are_read_from_each_family_format(fmt, text):
    assert parse(fmt, text) == RECORDED[(fmt, text)]


@pytest.mark.parametrize("fmt,text", NOT_CALLS)
def test_an_output_without_well_formed_calls_stays_content(fmt, text):
    assert parse(fmt, text) == (text, [])


def test_the_format_is_found_from_the_template():
    assert {name: detect(source) for name, source in TEMPLATES.items()} == {n: n for n in TEMPLATES}
    assert detect(CHAT_TEMPLATE) == "generic" and detect(None) == "generic"


def test_a_forced_output_is_read_as_its_calls():
    assert parse_forced("function:add", '{"a": 1, "b": 2}') == [ADD]
    assert parse_forced("required", '[{"name": "add", "arguments": {"a": 1, "b": 2}}]') == [ADD]
    assert parse_forced("required", '[{"name": "add", "argu') == []  # cut at max_tokens: no call
    cut = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {"a"'
    assert parse_forced("required", cut) == [ADD]  # the calls it completed
    assert parse_forced("function:add", "[1]") == []
