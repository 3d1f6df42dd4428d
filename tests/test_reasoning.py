"""Reasoning output of a checkpoint whose template thinks (Qwen3's <think>): the template's variables rendered as
transformers renders them, the reasoning split from the answer in chat (reasoning_content), Responses (a reasoning
item) and Anthropic (a thinking block) results, each parsed by its SDK, and reasoning_tokens counted."""
import shutil
from pathlib import Path

import pytest

from batchinfer.engine.loading.light_loader import LightTokenizer
from batchinfer.jobs.endpoints import anthropic, chat, reasoning, responses
from tool_templates import THINKING

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def thinking(tiny_model, tmp_path_factory):
    folder = Path(shutil.copytree(tiny_model, tmp_path_factory.mktemp("thinking") / "m"))
    (folder / "chat_template.jinja").write_text(THINKING)
    return folder


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_chat_template_kwargs_render_as_transformers_renders_them(thinking, kwargs):
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "Hi"}]
    body = chat.ChatBody.model_validate({"messages": messages, "chat_template_kwargs": kwargs})
    ours = body.prompt_text(LightTokenizer(thinking))
    assert ours == AutoTokenizer.from_pretrained(thinking).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **kwargs)
    assert ("<think>\n\n</think>" in ours) == (kwargs.get("enable_thinking") is False)


def test_a_reserved_template_variable_is_refused():
    with pytest.raises(ValueError, match="'tools' is set by the server"):
        chat.ChatBody.model_validate({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"tools": 1}})


@pytest.mark.parametrize("text,thought,answer", [
    ("<think>\nAdd them.\n</think>\n\nIt is 3.", "Add them.", "It is 3."),
    ("Add them.\n</think>\n\nIt is 3.", "Add them.", "It is 3."),  # the template opened the thought
    ("<think>\nStill adding", "Still adding", ""),  # cut short inside it
    ("It is 3.", None, "It is 3."),
])
def test_the_reasoning_is_split_from_the_answer(text, thought, answer):
    assert reasoning.split(text) == (thought, answer)


class _Result:
    prompt_tokens, cached_tokens, last_token_time, arrival_time, finish_reason = 5, 0, 1796582057.0, 1796582057.0, "stop"

    def __init__(self, tokenizer, text: str):
        self.text, self.output_token_ids = text, tokenizer.encode(text, add_special_tokens=False)
        self.completion_tokens = len(self.output_token_ids)


TEXT = "<think>\nOne plus two.\n</think>\n\nThree."


def test_chat_responses_and_anthropic_results_carry_the_reasoning(thinking):
    from anthropic.types import Message
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    tokenizer = LightTokenizer(thinking)
    result = _Result(tokenizer, TEXT)
    thought_tokens = len(tokenizer.encode("<think>\nOne plus two.\n</think>", add_special_tokens=False))
    echo = chat.ChatBody.model_validate({"messages": [{"role": "user", "content": "1+2?"}]}).echo(tokenizer)
    body = chat.result_body("r", "m", result, echo)
    parsed = ChatCompletion.model_validate(body)
    message = parsed.choices[0].message
    assert message.content == "Three." and message.reasoning_content == "One plus two."  # vLLM's name (an extra)
    assert parsed.usage.completion_tokens_details.reasoning_tokens == thought_tokens
    response = Response.model_validate(responses.result_body(
        "r", "m", result, responses.ResponsesBody.model_validate({"input": "1+2?"}).echo(tokenizer)))
    assert [i.type for i in response.output] == ["reasoning", "message"] and response.output_text == "Three."
    assert response.output[0].content[0].text == "One plus two."
    assert response.usage.output_tokens_details.reasoning_tokens == thought_tokens
    claude = Message.model_validate(anthropic.message(body))
    assert [b.type for b in claude.content] == ["thinking", "text"] and claude.content[0].thinking == "One plus two."


def test_a_template_that_does_not_think_leaves_the_text_alone(tiny_tokenizer):
    echo = chat.ChatBody.model_validate({"messages": [{"role": "user", "content": "1+2?"}]}).echo(tiny_tokenizer)
    body = chat.result_body("r", "m", _Result(tiny_tokenizer, TEXT), echo)
    assert echo is None and body["choices"][0]["message"] == {"role": "assistant", "content": TEXT}
    assert "completion_tokens_details" not in body["usage"]
