"""Tools on Anthropic lines (the Messages API's `tools`, `tool_choice`, `tool_use` and `tool_result` blocks), served by
the chat lines' machinery: the tools become function tools, the conversation chat messages (an assistant's tool_use
blocks its tool_calls, a user's tool_result blocks tool messages), and a result's tool_calls tool_use blocks."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr
from pydantic_core import PydanticCustomError

from batchinfer.jobs.endpoints import tool_defs
from batchinfer.jobs.endpoints.chat import ChatMessage
from batchinfer.jobs.endpoints.fields import Text


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = None  # accepted: our prefix cache needs no hint


class ToolUseBlock(BaseModel):
    """An earlier assistant turn's call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["tool_use"]
    id: StrictStr = Field(description="the call's id, which a tool_result names")
    name: StrictStr = Field(description="the called tool's name")
    input: dict[str, Any] = Field(description="the call's arguments, an object")
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(BaseModel):
    """A user turn's answer to a call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["tool_result"]
    tool_use_id: StrictStr = Field(description="the id of the tool_use it answers")
    content: Text | list[TextBlock] = Field("", description="a string or a list of text blocks")
    is_error: StrictBool | None = None
    cache_control: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)
        return f"Error: {text}" if self.is_error else text


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool | None = None


def check_tools(tools: list) -> list:
    """Each a custom tool `{"name", "description"?, "input_schema"}` (server tools such as web_search are refused),
    checked as a function tool is (the message names the tool)."""
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            raise PydanticCustomError("invalid_field", f"tool {k}: each tool must be a custom tool "
                                                       '{"name", "description", "input_schema"} (server tools are not served)')
        unknown = sorted(set(tool) - {"type", "name", "description", "input_schema", "cache_control"})
        if unknown:
            raise PydanticCustomError("invalid_field", f"tool {k}: {unknown[0]} is not a field of a tool")
    tool_defs.check_tools(function_tools(tools) or [])
    return tools


def function_tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    return [{"type": "function", "function": {"name": t.get("name"),
                                              **({"description": t["description"]} if "description" in t else {}),
                                              "parameters": t["input_schema"]}}
            for t in tools]


def chat_choice(choice: ToolChoice | None) -> tuple[Any, bool]:
    """(OpenAI's tool_choice, parallel_tool_calls) of Anthropic's tool_choice."""
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def chat_messages(system: str | None, messages: list) -> list[ChatMessage]:
    """The conversation as chat messages: text blocks joined, tool_use blocks an assistant's tool_calls, each
    tool_result block a tool message (before the user's own text of that turn)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
                 for b in blocks if isinstance(b, ToolUseBlock)]
        out += [{"role": "tool", "content": b.text, "tool_call_id": b.tool_use_id}
                for b in blocks if isinstance(b, ToolResultBlock)]
        if calls:
            out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        elif text or not any(isinstance(b, ToolResultBlock) for b in blocks):
            out.append({"role": m.role, "content": text})
    return [ChatMessage.model_validate(m) for m in out]


def content_blocks(message: dict) -> list[dict]:
    """A chat message's reasoning, text and tool_calls as Anthropic's content blocks (thinking, then text, then
    tool_use, as Claude writes them; a thinking block's signature is empty: nothing here signs it)."""
    thought = message.get("reasoning_content")
    blocks = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought is not None else []
    blocks += [{"type": "text", "text": message["content"]}] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        blocks.append({"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
                       "name": call["function"]["name"], "input": json.loads(call["function"]["arguments"])})
    return blocks or [{"type": "text", "text": ""}]
