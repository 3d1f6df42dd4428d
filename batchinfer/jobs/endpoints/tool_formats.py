"""How a checkpoint writes a tool call, found from its chat template, and the calls read back from its output.

- `hermes` (Qwen 2.5 / 3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call.
- `llama3_json` (Llama 3.1 / 3.2): the answer is `{"name": ..., "parameters": {...}}` (after `<|python_tag|>` or
  not), several separated by `;`.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the newer `[TOOL_CALLS]name[ARGS]{...}`.
- `generic`: a template that takes no tools (SmolLM2, the default model): the tools are described in a system
  message of ours (GENERIC_INSTRUCTIONS) and calls are read as hermes' blocks (docs/endpoints.md).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

FORMATS = ("hermes", "llama3_json", "mistral", "generic")
GENERIC_INSTRUCTIONS = (
    "You can call functions. These are their JSON signatures:\n{tools}\n"
    "To call a function, answer with one block per call, and nothing else:\n"
    '<tool_call>{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}</tool_call>')
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's function.arguments


def detect(chat_template: str | None) -> str:
    """The format a template writes calls in (its markers); `generic` for a template that never reads `tools`."""
    source = chat_template or ""
    if "tools" not in source:
        return "generic"
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    return "llama3_json"  # a template that reads tools without a marker: Llama 3.1's bare JSON


def generic_system(tools: list[dict], system: str | None) -> str:
    """The system message that describes the tools to a template that takes none (after the line's own system)."""
    described = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    text = GENERIC_INSTRUCTIONS.format(tools=described)
    return f"{system}\n\n{text}" if system else text


def generic_call_text(calls: list[dict]) -> str:
    """An assistant's earlier calls as the generic format writes them (for a template that has no tool_calls)."""
    return "".join(f'<tool_call>{json.dumps({"name": c["name"], "arguments": c["arguments"]}, ensure_ascii=False)}'
                   "</tool_call>" for c in calls)


def parse(fmt: str, text: str) -> tuple[str | None, list[Call]]:
    """(the content before the calls, the calls); no calls, and the whole text as content, unless every call found
    is a well-formed object with a name and JSON-object arguments."""
    if fmt == "mistral":
        head, calls = _mistral(text)
    elif fmt == "llama3_json":
        head, calls = _llama3(text)
    else:
        head, calls = _hermes(text)
    if not calls:
        return text, []
    return (head.strip() or None), calls


def parse_forced(mode: str, text: str) -> list[Call]:
    """The calls of an output held to forced_schema: a named function's arguments, or required's array. An array cut
    short at max_tokens keeps the calls it completed (the grammar held each one to its schema)."""
    if mode.startswith("function:"):
        value = _loads(text)
        return [Call(mode.removeprefix("function:"), _args(value))] if isinstance(value, dict) else []
    items = _complete_items(text)
    found = [_call(v, "arguments") for v in items]
    return [c for c in found if c is not None] if found and all(found) else []


def _complete_items(text: str) -> list[Any]:
    """The items of a JSON array up to the first one that is cut short."""
    decoder, items = json.JSONDecoder(), list[Any]()
    at = _skip(text, 0, " \n\t")
    if text[at:at + 1] != "[":
        return []
    at += 1
    while True:
        try:
            value, at = decoder.raw_decode(text, _skip(text, at, " \n\t"))
        except ValueError:
            return items
        items.append(value)
        at = _skip(text, at, " \n\t")
        if text[at:at + 1] != ",":
            return items
        at += 1


def _hermes(text: str) -> tuple[str, list[Call]]:
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls: list[Call] = []
    for block in _HERMES_BLOCK.findall(text[start:]):
        found = _calls_in(_loads(block), "arguments")
        if found is None:
            return text, []
        calls += found
    return text[:start], calls


def _llama3(text: str) -> tuple[str, list[Call]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    calls: list[Call] = []
    decoder, at = json.JSONDecoder(), 0
    while at < len(body):
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return text, []
        call = _call(value, "parameters")
        if call is None:
            return text, []
        calls.append(call)
        at = _skip(body, at, " \n\t;")
    return "", calls


def _mistral(text: str) -> tuple[str, list[Call]]:
    start = text.find("[TOOL_CALLS]")
    if start < 0:  # the marker is a special token, which decoding skips: the array of calls is left
        calls = _calls_in(_loads(text.strip()), "arguments") if text.strip().startswith("[{") else None
        return ("", calls) if calls else (text, [])
    rest = text[start + len("[TOOL_CALLS]"):].strip()
    if "[ARGS]" in rest:  # the newer format: name[ARGS]{...} per call
        pieces = [p.split("[ARGS]", 1) for p in rest.split("[TOOL_CALLS]")]
        found = [_call({"name": p[0].strip(), "arguments": _loads(p[1])}, "arguments") if len(p) == 2 else None
                 for p in pieces]
        return (text[:start], [c for c in found if c]) if all(found) else (text, [])
    calls = _calls_in(_loads(rest), "arguments")
    return (text[:start], calls) if calls else (text, [])


def _calls_in(value: Any, key: str) -> list[Call] | None:
    """An object or a list of objects, each a call; None if any is not."""
    items = value if isinstance(value, list) else [value]
    found = [_call(v, key) for v in items]
    return [c for c in found if c] if found and all(found) else None


def _call(value: Any, key: str) -> Call | None:
    """A call object: a string name and an object of arguments (under `key`, or `arguments` / `parameters`)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    args = value.get(key, value.get("arguments", value.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _loads(args)
    return Call(value["name"], _args(args)) if isinstance(args, dict) else None


def _args(value: dict) -> str:
    return json.dumps(value, ensure_ascii=False)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _skip(text: str, at: int, chars: str) -> int:
    while at < len(text) and text[at] in chars:
        at += 1
    return at
