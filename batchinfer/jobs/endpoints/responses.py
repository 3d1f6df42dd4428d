"""`/v1/responses`: a line's body (text input as a string or message and function call items, instructions, sampling,
function tools), and its result body (a Response). What we do not serve (built-in tools, reasoning,
previous_response_id, images) is refused by name, per line."""
from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from batchinfer.engine.types import SamplingParams
from batchinfer.jobs.endpoints import chat_tools, reasoning, responses_tools, tool_defs
from batchinfer.jobs.endpoints.fields import (MAX_METADATA_PAIRS, MAX_METADATA_VALUE, ROLES, MaxTokens, NonEmptyText,
                                              Number, Role, Text, template_message)
from batchinfer.jobs.endpoints.responses_tools import FunctionCallItem, FunctionCallOutputItem

RESPONSES_URL = "/v1/responses"
NOT_SUPPORTED = "absent (not supported here)"


def _text_config(value: dict) -> dict:
    """`text.format` as the Responses API has it: json_schema's name and schema sit in the format itself."""
    fmt = value.get("format")
    if fmt is None:
        return value
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise PydanticCustomError("invalid_field", 'needs "format": {"type": "text" | "json_object" | "json_schema"}')
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("schema"), dict):
        raise PydanticCustomError("invalid_field", 'of type json_schema needs "format": {"name", "schema": {...}}')
    return value


class InputText(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text"]  # an input_image, input_file or input_audio part is refused
    text: Text


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"  # a tool call or any other item is refused
    role: Role = Field(description=f"one of {', '.join(ROLES)}")
    content: Text | list[InputText] = Field(description="a string or a list of text parts")



class ResponsesBody(BaseModel):
    PROMPT_FIELD: ClassVar[str] = "input"
    model_config = ConfigDict(extra="ignore")

    input: NonEmptyText | Annotated[list[InputMessage | FunctionCallItem | FunctionCallOutputItem], Field(min_length=1)] = Field(
        description="a non-empty string or a non-empty array of message, function_call and function_call_output items")
    instructions: Text | None = Field(None, description="a string")
    max_output_tokens: MaxTokens | None = Field(None, description="an integer >= 1")
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = Field(None, description="a number in [0, 2]")
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = Field(None, description="a number in (0, 1]")
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=MAX_METADATA_VALUE)]],
                        Field(max_length=MAX_METADATA_PAIRS)] | None = Field(
        None, description=f"an object of at most {MAX_METADATA_PAIRS} string values")
    tools: Annotated[list, AfterValidator(responses_tools.check_tools)] | None = Field(
        None, description='a list of {"type": "function", "name", "description", "parameters"}')
    tool_choice: Annotated[Any, AfterValidator(responses_tools.check_choice)] = Field(
        None, description='"none", "auto", "required" or {"type": "function", "name"}')
    parallel_tool_calls: StrictBool | None = Field(None, description="true or false")
    reasoning: None = Field(None, description=NOT_SUPPORTED)
    previous_response_id: None = Field(None, description=NOT_SUPPORTED)
    conversation: None = Field(None, description=NOT_SUPPORTED)
    background: None = Field(None, description=NOT_SUPPORTED)
    stream: Literal[False] | None = Field(None, description="false (a batch result is never streamed)")
    # named apart from the text parts' `text` (line_problems.RULES is keyed by field name); the line says "text"
    text_config: Annotated[dict, AfterValidator(_text_config)] | None = Field(
        None, alias="text", description='an object {"format": {"type": "text" | "json_object" | "json_schema", ...}}')

    @field_validator("tool_choice")
    @classmethod
    def _named_tool(cls, value, info: ValidationInfo):
        if isinstance(value, dict) and "tools" in info.data and value["name"] not in tool_defs.names(
                responses_tools.function_tools(info.data["tools"])):
            raise PydanticCustomError("invalid_field", "names no function of tools")
        return value

    def _chat(self) -> tuple[list[dict] | None, str, bool]:
        """(function tools, the chat mode, parallel calls) this line runs with."""
        tools = responses_tools.function_tools(self.tools)
        return tools, tool_defs.choice_mode(responses_tools.chat_choice(self.tool_choice), tools), self.parallel_tool_calls is not False

    def prompt_text(self, tokenizer) -> str:
        items = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        messages = responses_tools.chat_messages(self.instructions, items, template_message)
        return chat_tools.prompt_text(tokenizer, messages, self._chat()[0])

    def params(self, default_max_tokens: int, defaults: dict | None = None) -> SamplingParams:
        """defaults: the checkpoint's generation_config.json sampling for what the line leaves unset."""
        limit = self.max_output_tokens if self.max_output_tokens is not None else default_max_tokens
        d = defaults or {}
        return SamplingParams(max_tokens=limit, temperature=float(d.get("temperature", 1.0) if self.temperature is None
                                                                  else self.temperature),
                              top_p=float(d.get("top_p", 1.0) if self.top_p is None else self.top_p),
                              top_k=d.get("top_k", 0), repetition_penalty=float(d.get("repetition_penalty", 1.0)),
                              guided=self.constraint())

    def text_format(self) -> dict:
        return (self.text_config or {}).get("format") or {"type": "text"}

    def constraint(self) -> tuple[str, str] | None:
        """The grammar a forced tool_choice or `text.format` holds the output to (engine/sampling/grammar.py's
        (kind, spec)), or None."""
        forced = chat_tools.forced_constraint(*self._chat())
        if forced is not None:
            return forced
        fmt = self.text_format()
        if fmt["type"] == "json_schema":
            return "json_schema", json.dumps(fmt["schema"], sort_keys=True)
        return ("json_object", "") if fmt["type"] == "json_object" else None

    def constraints_given(self) -> list[str]:
        forced = chat_tools.forced_constraint(*self._chat()) is not None
        fmt = self.text_format()["type"] in ("json_object", "json_schema")
        return (["tool_choice"] if forced else []) + (["text.format"] if fmt else [])

    def echo(self, tokenizer=None) -> dict[str, Any]:
        """What the Response object repeats of the request, and what reading calls back needs (chat_tools.echo)."""
        tools = {**(chat_tools.echo(tokenizer, *self._chat()) or {}), **(reasoning.echo(tokenizer) or {})} if tokenizer is not None else {}
        return {"instructions": self.instructions, "metadata": self.metadata or {},
                "max_output_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "text": {"format": self.text_format()}, "tools": self.tools or [],
                "tool_choice": self.tool_choice or ("auto" if self.tools else "none"),
                "parallel_tool_calls": self.parallel_tool_calls is not False, **(tools or {})}


def result_body(rid: str, model: str, result, echo: dict[str, Any] | None = None) -> dict:
    """A Response object (`openai.types.responses.Response`): one assistant message, or the calls the model made
    (function_call items, after any text)."""
    echo = echo or {}
    incomplete = result.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    message, _ = chat_tools.message(result.text, result.finish_reason, echo, rid)
    thought = reasoning.token_count(list(result.output_token_ids), echo["think_end_ids"], result.text) if (
        "think_end_ids" in echo) else 0
    return {"id": f"resp_{rid}", "object": "response", "created_at": int(result.arrival_time), "status": status,
            "model": model, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": responses_tools.output_items(message, rid, status),
            "parallel_tool_calls": echo.get("parallel_tool_calls", False), "tool_choice": echo.get("tool_choice", "none"),
            "tools": echo.get("tools") or [],
            "instructions": echo.get("instructions"), "metadata": echo.get("metadata") or {},
            "max_output_tokens": echo.get("max_output_tokens"), "temperature": echo.get("temperature"),
            "top_p": echo.get("top_p"), "text": echo.get("text") or {"format": {"type": "text"}},
            "usage": {"input_tokens": result.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": result.cached_tokens, "cache_write_tokens": 0},
                      "output_tokens": result.completion_tokens, "output_tokens_details": {"reasoning_tokens": thought},
                      "total_tokens": result.prompt_tokens + result.completion_tokens}}
