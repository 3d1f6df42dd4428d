"""Tools on a chat line, between the body and the model: the conversation rendered with the tools by the checkpoint's
own template (or our generic format where the template takes none), the grammar of a forced choice, and the
assistant message read back from the output (tool_calls, finish_reason "tool_calls")."""
from __future__ import annotations

import json
from typing import Any

from batchinfer.jobs.endpoints import reasoning, tool_defs, tool_formats
from batchinfer.jobs.endpoints.fields import template_message


def template_format(tokenizer) -> str:
    return tool_formats.detect(getattr(tokenizer, "chat_template", None))


def prompt_text(tokenizer, messages: list, tools: list[dict] | None, variables: dict | None = None) -> str:
    """The prompt as transformers' apply_chat_template(messages, tools=..., **variables) renders it; a template without
    tools gets them in a system message of ours, and earlier calls and results as text it can print."""
    variables = variables or {}
    if not tools and not any(m.tool_calls or m.role == "tool" for m in messages):
        return tokenizer.apply_chat_template([template_message(m.role, m.content) for m in messages],
                                             add_generation_prompt=True, tokenize=False, **variables)
    if template_format(tokenizer) == "generic":
        return tokenizer.apply_chat_template(_generic_messages(messages, tools), add_generation_prompt=True,
                                             tokenize=False, **variables)
    rendered = _template_messages(messages)
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False, **extra, **variables)


def _template_messages(messages: list) -> list[dict]:
    """Messages as chat templates read them: an assistant's calls with their arguments as objects (Qwen's and Llama's
    templates print them with tojson), a tool message with the name of the function it answers."""
    names = {c.id: c.function.name for m in messages for c in m.tool_calls or ()}
    out = []
    for m in messages:
        entry: dict[str, Any] = template_message(m.role, m.content or "")
        if m.tool_calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.function.name, "arguments": _object(c.function.arguments)}}
                                   for c in m.tool_calls]
        if m.role == "tool":
            entry |= {"tool_call_id": m.tool_call_id, "name": names.get(m.tool_call_id, "")}
        out.append(entry)
    return out


def _generic_messages(messages: list, tools: list[dict] | None) -> list[dict]:
    """The generic format: the tools in the first system message, calls as <tool_call> blocks in the assistant's
    text, and a run of tool results as one user message of <tool_response> blocks (templates that insist on
    alternating user and assistant turns take that)."""
    out: list[dict] = []
    after_tool = False  # the last message was a tool result: the next one joins its user message
    for m in messages:
        entry = template_message(m.role, m.content or "")
        if m.tool_calls:
            calls = [{"name": c.function.name, "arguments": _object(c.function.arguments)} for c in m.tool_calls]
            entry["content"] += tool_formats.generic_call_text(calls)
        if m.role == "tool":
            block = f"<tool_response>\n{entry['content']}\n</tool_response>"
            if after_tool:
                out[-1]["content"] += "\n" + block
                continue
            entry = {"role": "user", "content": block}
        after_tool = m.role == "tool"
        out.append(entry)
    if tools:
        system = out[0]["content"] if out[0]["role"] == "system" else None
        out = [{"role": "system", "content": tool_formats.generic_system(tools, system)}] + out[system is not None:]
    return out


def _object(arguments: str) -> Any:
    """A call's arguments as the object templates expect; text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def forced_constraint(tools: list[dict] | None, mode: str, parallel: bool) -> tuple[str, str] | None:
    schema = tool_defs.forced_schema(tools or [], mode, parallel) if tools else None
    # keys in their given order: the grammar keeps a schema's property order, and a call names its function first
    return ("tool_calls", json.dumps(schema)) if schema is not None else None


def echo(tokenizer, tools: list[dict] | None, mode: str, parallel: bool) -> dict[str, Any] | None:
    if not tools or mode == "none":
        return None
    return {"tool_format": template_format(tokenizer), "tool_mode": mode, "tool_names": tool_defs.names(tools),
            "parallel_tool_calls": parallel}


def message(text: str, finish_reason: str, echo: dict | None, call_prefix: str) -> tuple[dict, str]:
    """The assistant message of a sample and its finish_reason: a thinking template's reasoning split off first, then
    calls read from the text where the line has tools (a forced line's JSON, else the model's own format); calls that
    name no function of the line's are not calls."""
    thought, text = reasoning.split(text) if echo and "think_end_ids" in echo else (None, text)
    shown = {"reasoning_content": thought, "reasoning": thought} if thought is not None else {}  # vLLM's two names
    message, finish = _calls(text, finish_reason, echo, call_prefix)
    return {**message, **shown}, finish


def _calls(text: str, finish_reason: str, echo: dict | None, call_prefix: str) -> tuple[dict, str]:
    if not echo or "tool_mode" not in echo:
        return {"role": "assistant", "content": text}, finish_reason
    mode = echo["tool_mode"]
    if mode == "required" or mode.startswith("function:"):
        content, calls = None, tool_formats.parse_forced(mode, text)
    else:
        content, calls = tool_formats.parse(echo["tool_format"], text)
    if not calls or any(c.name not in echo["tool_names"] for c in calls):
        return {"role": "assistant", "content": text}, finish_reason
    if not echo.get("parallel_tool_calls", True):
        calls = calls[:1]
    tool_calls = [{"id": f"call_{call_prefix}_{k}", "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}} for k, c in enumerate(calls)]
    # a required array cut at max_tokens keeps its complete calls, and says it was cut
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}, (
        "length" if finish_reason == "length" else "tool_calls")
