"""Function tools on `/v1/responses` lines, served by the chat lines' machinery: Responses' flat function tools and
`tool_choice` as chat's, the input's `function_call` / `function_call_output` items as an assistant's tool_calls and
tool messages, and a result's calls as `function_call` output items."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr
from pydantic_core import PydanticCustomError

from batchinfer.jobs.endpoints import tool_defs
from batchinfer.jobs.endpoints.chat import ChatMessage
from batchinfer.jobs.endpoints.fields import Text


class FunctionCallItem(BaseModel):
    """An earlier call of the model's, as a Response's output gave it."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: StrictStr = Field(description="the call's id, which its function_call_output names")
    name: StrictStr = Field(description="the called function's name")
    arguments: StrictStr = Field(description="the call's arguments, a JSON object as a string")


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: StrictStr = Field(description="the call's id, which its function_call_output names")
    output: Text = Field(description="the function's result, a string")


def check_tools(tools: list) -> list:
    """Each `{"type": "function", "name", "description"?, "parameters"?, "strict"?}` (built-in tools such as
    web_search or file_search are refused), checked as a chat line's function is (the message names the tool)."""
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise PydanticCustomError("invalid_field", f'tool {k}: each tool must be {{"type": "function", "name", '
                                                       '"parameters"}} (built-in tools are not served)')
    tool_defs.check_tools(function_tools(tools) or [])
    return tools


def function_tools(tools: list[dict] | None) -> list[dict] | None:
    if not tools:
        return None
    return [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools]


def check_choice(choice: Any) -> Any:
    """`none`, `auto`, `required`, or `{"type": "function", "name"}`."""
    if isinstance(choice, str) and choice in tool_defs.CHOICE_MODES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return choice
    raise PydanticCustomError("invalid_field", 'must be "none", "auto", "required" or {"type": "function", "name": ...}')


def chat_choice(choice: Any) -> Any:
    return {"type": "function", "function": {"name": choice["name"]}} if isinstance(choice, dict) else choice


def chat_messages(instructions: str | None, items: list, template_message) -> list[ChatMessage]:
    """The input as chat messages: a run of function_call items one assistant turn of tool_calls, each
    function_call_output a tool message."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
        else:
            out.append(template_message(item.role, item.content))
    return [ChatMessage.model_validate(m) for m in out]


def output_items(message: dict, rid: str, status: str) -> list[dict]:
    """A chat message as a Response's output: its reasoning a reasoning item, its text a message item, each call a
    function_call item."""
    items = []
    if message.get("reasoning_content") is not None:  # a thinking checkpoint's reasoning, before its answer
        items.append({"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": status,
                      "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
    if message.get("content") or not message.get("tool_calls"):
        items.append({"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": status, "content": [
            {"type": "output_text", "text": message.get("content") or "", "annotations": [], "logprobs": []}]})
    for k, call in enumerate(message.get("tool_calls") or ()):
        items.append({"type": "function_call", "id": f"fc_{rid}_{k}", "call_id": call["id"],
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": "completed"})
    return items
