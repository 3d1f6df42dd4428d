"""Anthropic's Message Batches: a create body, its requests checked as Anthropic checks them at create (each a
custom_id and a params object) and stored as our input lines of url /v1/messages with the params as they came (so the
job system underneath is the one for every batch); the params are checked later, at validation, each request failing
alone (Anthropic's split: an `errored` result), as a Params body. A result as Anthropic's (a Message, or why there is
none)."""
from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from batchinfer.engine.types import SamplingParams
from batchinfer.errors import InvalidRequest, shown
from batchinfer.jobs.endpoints import anthropic_tools, chat_tools, reasoning, tool_defs
from batchinfer.jobs.endpoints.anthropic_tools import Block, TextBlock
from batchinfer.jobs.endpoints.fields import MAX_STOP, MaxTokens, NonEmptyText, Number, Text

MESSAGES_ENDPOINT = "/v1/messages"  # the endpoint of a job made through the Message Batches API, and its lines' url
CUSTOM_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # Anthropic's rule


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: Text | Annotated[list[Block], Field(min_length=1)]


def _ends_with_user(messages: list[Message]) -> list[Message]:
    if messages[-1].role != "user":
        raise PydanticCustomError("invalid_field", "the last message must be a user message (assistant prefill is not "
                                  "supported)")
    return messages


class Params(BaseModel):
    """A request's params, as a line's body (kinds.BODIES[MESSAGES_ENDPOINT]): the Messages API fields we serve; any
    other (tools, thinking, images...) is refused by name, as that request's error."""

    PROMPT_FIELD: ClassVar[str] = "messages"
    model_config = ConfigDict(extra="forbid")

    model: NonEmptyText = Field(description="a model id")
    max_tokens: MaxTokens = Field(description="an integer >= 1")
    messages: Annotated[list[Message], Field(min_length=1), AfterValidator(_ends_with_user)] = Field(
        description="a non-empty array of messages")
    system: Text | list[TextBlock] | None = Field(None, description="a string or a list of text blocks")
    temperature: Annotated[Number, Field(ge=0, le=1)] | None = Field(None, description="a number in [0, 1]")
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = Field(None, description="a number in (0, 1]")
    top_k: Annotated[StrictInt, Field(ge=0)] | None = Field(None, description="an integer >= 0")
    stop_sequences: Annotated[list[NonEmptyText], Field(max_length=MAX_STOP)] | None = Field(
        None, description=f"a list of up to {MAX_STOP} non-empty strings")
    metadata: dict[str, Any] | None = None  # accepted and not used (user_id)
    stream: Literal[False] | None = None  # a batch result is never streamed
    tools: Annotated[list, AfterValidator(anthropic_tools.check_tools)] | None = Field(
        None, description='a list of custom tools {"name", "description", "input_schema"}')
    thinking: None = Field(None, description="absent (extended thinking is not served here)")
    tool_choice: anthropic_tools.ToolChoice | None = Field(
        None, description='an object {"type": "auto" | "any" | "tool" | "none", "name"?, "disable_parallel_tool_use"?}')

    @field_validator("tool_choice")
    @classmethod
    def _named_tool(cls, value, info: ValidationInfo):
        if value is not None and "tools" in info.data:
            named = tool_defs.names(anthropic_tools.function_tools(info.data["tools"]))
            if value.type == "tool" and value.name not in named:
                raise PydanticCustomError("invalid_field", "of type tool must name one of tools")
        return value

    def _chat(self) -> tuple[list[dict] | None, str, bool]:
        """(function tools, the chat mode, parallel calls) this request runs with."""
        tools = anthropic_tools.function_tools(self.tools)
        choice, parallel = anthropic_tools.chat_choice(self.tool_choice)
        return tools, tool_defs.choice_mode(choice, tools), parallel

    def prompt_text(self, tokenizer) -> str:
        system = self.system if isinstance(self.system, str) or self.system is None else "".join(
            b.text for b in self.system)
        return chat_tools.prompt_text(tokenizer, anthropic_tools.chat_messages(system, self.messages), self._chat()[0])

    def echo(self, tokenizer) -> dict[str, Any] | None:
        found = {**(chat_tools.echo(tokenizer, *self._chat()) or {}), **(reasoning.echo(tokenizer) or {})}
        return found or None

    def params(self, default_max_tokens: int, defaults: dict | None = None) -> SamplingParams:
        """defaults: the checkpoint's generation_config.json sampling for what the request leaves unset."""
        d = defaults or {}
        return SamplingParams(max_tokens=self.max_tokens,
                              temperature=float(d.get("temperature", 1.0) if self.temperature is None else self.temperature),
                              top_p=float(d.get("top_p", 1.0) if self.top_p is None else self.top_p),
                              top_k=d.get("top_k", 0) if self.top_k is None else self.top_k,
                              repetition_penalty=float(d.get("repetition_penalty", 1.0)),
                              stop=tuple(self.stop_sequences or ()), guided=self.constraint())

    def constraint(self) -> tuple[str, str] | None:
        return chat_tools.forced_constraint(*self._chat())

    def constraints_given(self) -> list[str]:
        return ["tool_choice"] if self.constraint() is not None else []


class BatchRequest(BaseModel):
    """What create checks of a request (Anthropic's split): its custom_id, and params an object."""

    model_config = ConfigDict(extra="forbid")

    custom_id: Annotated[str, Field(pattern=CUSTOM_ID_PATTERN, strict=True)]
    params: dict[str, Any]


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: Annotated[list[BatchRequest], Field(min_length=1)]


def parse_create(raw: bytes, max_requests: int) -> CreateBody:
    """The create body, or InvalidRequest naming the first bad field as Anthropic does (`requests.0.params.x`)."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise InvalidRequest("the request body is not valid JSON") from None
    if isinstance(data, dict) and isinstance(data.get("requests"), list) and len(data["requests"]) > max_requests:
        raise InvalidRequest(f"requests: at most {max_requests} requests a batch")
    try:
        body = CreateBody.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(_first_problem(exc)) from None
    seen: set[str] = set()
    for n, request in enumerate(body.requests):
        if request.custom_id in seen:
            raise InvalidRequest(f"requests.{n}.custom_id: {request.custom_id!r} is used by an earlier request; "
                                 "each custom_id must be unique in the batch")
        seen.add(request.custom_id)
    return body


def _first_problem(exc: ValidationError) -> str:
    """The first field that is wrong, and under a union (a string or a list of blocks) its deepest problem."""
    found = [(_loc(e["loc"]), e) for e in exc.errors(include_url=False)]
    top = found[0][0]
    loc, error = max((f for f in found if f[0][:len(top)] == top), key=lambda f: len(f[0]))
    where = ".".join(str(s) for s in loc)
    if error["type"] == "extra_forbidden":
        return f"{where}: this field is not supported here"
    if error["type"] == "missing":
        return f"{where}: field required"
    if error["type"] == "value_error":  # our own rule: its message says it all
        return f"{where}: {error['msg'].removeprefix('Value error, ')}"
    return f"{where or 'body'}: {error['msg']}" + (f", got {shown(error['input'])}" if where else "")


def _loc(loc: tuple) -> tuple:
    """Without pydantic's union member tags ('str', 'list[TextBlock]'): they are no field of the request."""
    return tuple(s for s in loc if isinstance(s, int) or ("[" not in s and s not in ("str", "function-after")))


def input_lines(body: CreateBody) -> bytes:
    """Our input lines, one per request, in order: the params as they came, checked at validation."""
    lines = [json.dumps({"custom_id": r.custom_id, "method": "POST", "url": MESSAGES_ENDPOINT, "body": r.params},
                        ensure_ascii=False, separators=(",", ":")) for r in body.requests]
    return ("\n".join(lines) + "\n").encode()


# ---- results ----------------------------------------------------------------------------------------------

UNFINISHED = {"batch_cancelled": "canceled", "batch_expired": "expired"}
ERROR_TYPES = {"model_not_found": "not_found_error", "server_error": "api_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def result(entry: dict) -> dict:
    """An output or error line of ours as an Anthropic result (a refused body has a response too: its 400)."""
    error = entry.get("error")
    if not error:
        return {"type": "succeeded", "message": message(entry["response"]["body"])}
    if error["code"] in UNFINISHED:
        return {"type": UNFINISHED[error["code"]]}
    return errored(ERROR_TYPES.get(error["code"], "invalid_request_error"), f"{error['code']}: {error['message']}")


def errored(kind: str, text: str) -> dict:
    return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": text}}}


def message(body: dict) -> dict:
    """A chat.completion body as Anthropic's Message: input_tokens count the prompt tokens not read from the
    prefix cache, as Anthropic's do."""
    choice, usage = body["choices"][0], body["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"id": "msg_" + body["id"].removeprefix("chatcmpl-"), "type": "message", "role": "assistant",
            "model": body["model"], "content": anthropic_tools.content_blocks(choice["message"]),
            **stop(choice),
            "usage": {"input_tokens": usage["prompt_tokens"] - cached, "output_tokens": usage["completion_tokens"],
                      "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}}


def stop(choice: dict) -> dict:
    """A stop string the sample ended on (the choice's stop_reason, vLLM's field) is Anthropic's stop_sequence."""
    matched = choice.get("stop_reason")
    if choice["finish_reason"] == "stop" and isinstance(matched, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": STOP_REASONS.get(choice["finish_reason"], "end_turn"), "stop_sequence": None}
