"""A chat line's tools as OpenAI's Chat Completions take them: the function definitions, `tool_choice` and
`parallel_tool_calls` checked at submit time (a bad definition is refused naming the tool), and the grammar that
`required` or a named choice holds the output to while decoding (vLLM's way: the output is JSON, the calls
themselves, rather than the model's own tool-call markup)."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from pydantic_core import PydanticCustomError

from batchinfer.errors import shown

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
MAX_TOOLS = 128  # as OpenAI
CHOICE_MODES = ("none", "auto", "required")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _refuse(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_field", message)


def check_tools(tools: list) -> list:
    """Each tool `{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}`, its name
    unique, its parameters a JSON schema object the grammar library compiles."""
    if not tools:
        raise _refuse("must hold at least one tool (leave tools out for none)")
    if len(tools) > MAX_TOOLS:
        raise _refuse(f"must hold at most {MAX_TOOLS} tools")
    seen: set[str] = set()
    for k, tool in enumerate(tools):
        name = _check_tool(k, tool)
        if name in seen:
            raise _refuse(f"tool {k} ({name!r}): the name is used by an earlier tool")
        seen.add(name)
    return tools


def _check_tool(k: int, tool: Any) -> str:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise _refuse(f'tool {k}: each tool must be {{"type": "function", "function": {{"name", "parameters"}}}}')
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise _refuse(f"tool {k} ({shown(name)}): function.name must match ^[a-zA-Z0-9_-]{{1,64}}$")
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise _refuse(f"tool {k} ({name!r}): function.{unknown[0]} is not a field of a function")
    if "description" in function and not isinstance(function["description"], str):
        raise _refuse(f"tool {k} ({name!r}): function.description must be a string")
    parameters = function.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise _refuse(f'tool {k} ({name!r}): function.parameters must be a JSON schema of "type": "object"')
    reason = _compile_problem(json.dumps(parameters, sort_keys=True))
    if reason is not None:
        raise _refuse(f"tool {k} ({name!r}): function.parameters cannot be served: {reason}")
    return name


@lru_cache(maxsize=256)
def _compile_problem(schema: str) -> str | None:
    from batchinfer.engine.sampling.grammar_check import check_constraint  # lazy: xgrammar, for lines with tools only

    reason = check_constraint("json_schema", schema)
    # the library's message carries its time and source position: the reason is what follows
    return re.sub(r"\[[\d:]+\] \S+: ", "", reason) if reason else None


def check_choice(choice: Any) -> Any:
    """`none`, `auto`, `required`, or `{"type": "function", "function": {"name"}}` (which tools holds: _check_named)."""
    if isinstance(choice, str) and choice in CHOICE_MODES:
        return choice
    named = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(named, dict) or not isinstance(named.get("name"), str):
        raise _refuse('must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
    return choice


def names(tools: list[dict] | None) -> list[str]:
    return [t["function"]["name"] for t in tools or ()]


def parameters_of(tool: dict) -> dict:
    return tool["function"].get("parameters") or EMPTY_PARAMETERS


def choice_mode(choice: Any, tools: list[dict] | None) -> str:
    """The mode a line runs in: none (no tools, or tool_choice none), auto, required, or the named function's name
    prefixed `function:` (OpenAI's default is auto when tools are given)."""
    if not tools:
        return "none"
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else f"function:{choice['function']['name']}"


def forced_schema(tools: list[dict], mode: str, parallel: bool) -> dict | None:
    """The JSON schema the output is held to: a named function's arguments, or under `required` an array of
    `{"name", "arguments"}` calls (one call only without parallel_tool_calls); None where the model chooses."""
    if mode.startswith("function:"):
        wanted = mode.removeprefix("function:")
        return next(parameters_of(t) for t in tools if t["function"]["name"] == wanted)
    if mode != "required":
        return None
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]}, "arguments": parameters_of(t)},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
            "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
