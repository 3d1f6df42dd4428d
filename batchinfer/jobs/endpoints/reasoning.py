"""Reasoning output of checkpoints whose chat template thinks (Qwen3's `<think>...</think>`): the reasoning split from
the answer, and how many of the completion's tokens it took. A template thinks when it writes `<think>` itself;
`chat_template_kwargs` (vLLM's: `{"enable_thinking": false}`) and `reasoning_effort` reach the template as variables."""
from __future__ import annotations

from typing import Any

START, END = "<think>", "</think>"


def template_thinks(chat_template: str | None) -> bool:
    return START in (chat_template or "")


def echo(tokenizer) -> dict[str, Any] | None:
    """What reading the reasoning back needs: the token ids that close it (counted in reasoning_tokens)."""
    if not template_thinks(getattr(tokenizer, "chat_template", None)):
        return None
    return {"think_end_ids": list(tokenizer.encode(END, add_special_tokens=False))}


def split(text: str) -> tuple[str | None, str]:
    """(the reasoning, the answer). The reasoning ends at `</think>` (its `<think>` may be in the prompt, as templates
    that open it for the model write it); an output cut short inside it is all reasoning."""
    end = text.find(END)
    if end >= 0:
        return text[:end].replace(START, "", 1).strip(), text[end + len(END):].lstrip()
    if text.lstrip().startswith(START):
        return text.lstrip()[len(START):].strip(), ""
    return None, text


def token_count(output_ids: list[int], end_ids: list[int], text: str) -> int:
    """Tokens up to and including the closing `</think>` (all of them when the output was cut inside it)."""
    if not end_ids:
        return 0
    for at in range(len(output_ids) - len(end_ids) + 1):
        if output_ids[at:at + len(end_ids)] == end_ids:
            return at + len(end_ids)
    return len(output_ids) if text.lstrip().startswith(START) else 0
