"""`/v1/chat/completions`: a line's body (messages, sampling, tools), and its result body (`chat.completion`)."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (AfterValidator, BaseModel, Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from batchinfer.jobs.endpoints import chat_tools, reasoning, tool_defs
from batchinfer.jobs.endpoints.fields import LOGPROBS_RULE, MAX_TOP_LOGPROBS, Text, token_text, usage
from batchinfer.jobs.endpoints.sampling import Sampling

CHAT_URL = "/v1/chat/completions"
ChatRole = Literal["system", "user", "assistant", "developer", "tool"]
CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    name: StrictStr = Field(description="the called function's name")
    arguments: StrictStr = Field(description="the call's arguments, a JSON object as a string")


class ToolCall(BaseModel):
    """An earlier assistant turn's call, as the API returned it."""

    id: StrictStr = Field(description="the call's id, which the tool message answering it names")
    type: Literal["function"] = "function"
    function: FunctionCall = Field(description='an object {"name", "arguments"}')


class ChatMessage(BaseModel):
    role: ChatRole = Field(description=f"one of {', '.join(CHAT_ROLES)}")
    content: Text | list[TextPart] | None = Field(description="a string or a list of text parts")
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = Field(
        None, description="a non-empty list of calls (an assistant message's)")
    tool_call_id: StrictStr | None = Field(None, description="the id of the call a tool message answers")

    @model_validator(mode="before")
    @classmethod
    def _calls_need_no_content(cls, data: Any) -> Any:
        # OpenAI: an assistant message that calls tools may leave its content out
        if isinstance(data, dict) and data.get("role") == "assistant" and data.get("tool_calls") and "content" not in data:
            return {**data, "content": None}
        return data

    @model_validator(mode="after")
    def _roles(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("invalid_field", "content may be null only in an assistant message with tool_calls")
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("invalid_field", "only an assistant message has tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise PydanticCustomError("invalid_field", "a tool message, and only a tool message, needs tool_call_id")
        return self


RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt", "tokenize")


def _no_reserved_keys(value: dict) -> dict:
    taken = sorted(set(value) & set(RESERVED_TEMPLATE_VARIABLES))
    if taken:
        raise PydanticCustomError("invalid_field", f"{taken[0]!r} is set by the server, not by chat_template_kwargs")
    return value


class ChatBody(Sampling):
    PROMPT_FIELD: ClassVar[str] = "messages"

    messages: list[ChatMessage] = Field(min_length=1, description="a non-empty array of messages")
    logprobs: StrictBool | None = Field(None, description=LOGPROBS_RULE)
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description=f"an integer in [0, {MAX_TOP_LOGPROBS}], with logprobs: true")
    tools: Annotated[list, AfterValidator(tool_defs.check_tools)] | None = Field(  # type: ignore[assignment]
        None, description='a list of {"type": "function", "function": {"name", "description", "parameters"}}')
    tool_choice: Annotated[Any, AfterValidator(tool_defs.check_choice)] = Field(
        None, description='"none", "auto", "required" or {"type": "function", "function": {"name"}}, with tools')
    parallel_tool_calls: StrictBool | None = Field(None, description="true or false, with tools")  # type: ignore[assignment]
    chat_template_kwargs: Annotated[dict[str, StrictStr | StrictBool | StrictInt | float | None],
                                    AfterValidator(_no_reserved_keys)] | None = Field(
        None, description='an object of template variables (vLLM\'s: {"enable_thinking": false})')
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="one of none, minimal, low, medium, high (a variable of the template, where it reads one)")

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value, info: ValidationInfo):
        if value is not None and info.data.get("logprobs") is not True:
            raise PydanticCustomError("invalid_field", "needs logprobs: true")
        return value

    @field_validator("tool_choice", "parallel_tool_calls")
    @classmethod
    def _needs_tools(cls, value, info: ValidationInfo):
        if "tools" not in info.data:  # tools itself was refused: that is the line's problem
            return value
        tools = info.data["tools"]
        if value is not None and not tools:
            raise PydanticCustomError("invalid_field", "is only allowed when tools are given")
        if isinstance(value, dict) and value["function"]["name"] not in tool_defs.names(tools):
            raise PydanticCustomError("invalid_field", "names no function of tools")
        return value

    def top_logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_mode(self) -> str:
        return tool_defs.choice_mode(self.tool_choice, self.tools)

    def template_variables(self) -> dict[str, Any]:
        effort = {"reasoning_effort": self.reasoning_effort} if self.reasoning_effort else {}
        return {**(self.chat_template_kwargs or {}), **effort}

    def prompt_text(self, tokenizer) -> str:
        return chat_tools.prompt_text(tokenizer, self.messages, self.tools, self.template_variables())

    def constraint(self) -> tuple[str, str] | None:
        forced = chat_tools.forced_constraint(self.tools, self.tool_mode(), self.parallel_tool_calls is not False)
        return forced or super().constraint()

    def constraints_given(self) -> list[str]:
        forced = self.tool_mode() == "required" or self.tool_mode().startswith("function:")
        return (["tool_choice"] if forced else []) + super().constraints_given()

    def echo(self, tokenizer) -> dict[str, Any] | None:
        """What the result body needs to read calls and reasoning back: the format, the mode, the functions' names,
        the tokens that end a thought."""
        found = {**(chat_tools.echo(tokenizer, self.tools, self.tool_mode(), self.parallel_tool_calls is not False) or {}),
                 **(reasoning.echo(tokenizer) or {})}
        return found or None


def result_body(rid: str, model: str, result, echo: dict | None = None) -> dict:
    """A `chat.completion`: one choice per sample, usage counting the prompt once (and every sample's reasoning)."""
    samples = getattr(result, "samples", None) or [result]
    counted = usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens)
    if echo and "think_end_ids" in echo:
        thought = sum(reasoning.token_count(list(s.output_token_ids), echo["think_end_ids"], s.text) for s in samples)
        counted["completion_tokens_details"] = {"reasoning_tokens": thought}
    return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(result.last_token_time),
            "model": model, "choices": [choice(i, s, echo, rid) for i, s in enumerate(samples)], "usage": counted}


def choice(index: int, result, echo: dict | None = None, rid: str = "") -> dict:
    # stop_reason is vLLM's extra: the stop string or stop token id that ended the sample, else null
    message, finish = chat_tools.message(result.text, result.finish_reason, echo, f"{rid}_{index}")
    return {"index": index, "message": message, "logprobs": logprobs(getattr(result, "logprobs", None)),
            "finish_reason": finish, "stop_reason": getattr(result, "stop_reason", None)}


def logprobs(entries) -> dict | None:
    """Chat's `logprobs.content[]`."""
    if entries is None:
        return None
    content = [{"token": token_text(e.token_bytes), "logprob": e.logprob, "bytes": list(e.token_bytes),
                "top_logprobs": [{"token": token_text(b), "logprob": lp, "bytes": list(b)}
                                 for b, (_, lp) in zip(e.top_bytes, e.top)]}
               for e in entries]
    return {"content": content, "refusal": None}
