"""A chat template rendered once per shape (the roles in order, and whether the assistant turn is opened), the
contents then filled in: rendering jinja2 for every line cost more than tokenizing it.

Only for a template that prints each message's content as it is, nowhere else: no filter, test, condition,
call or assignment on a content (checked on the template's syntax tree). Any other template, or a shape whose
trial rendering does not show each content exactly once, is rendered in full every time.
"""
from __future__ import annotations

import uuid
from typing import Any

MAX_SHAPES = 256  # distinct shapes kept; past it, new shapes are rendered in full


def contents_only_printed(source: str, env) -> bool:
    """True when every `message['content']` (or `.content`) in the template is printed as is, alone or joined
    with `+` or `~`, so the output is the same text around each content whatever the contents are."""
    from jinja2 import nodes  # lazy: jinja2, when a chat template renders

    def is_content(n) -> bool:
        return ((isinstance(n, nodes.Getitem) and isinstance(n.arg, nodes.Const) and n.arg.value == "content")
                or (isinstance(n, nodes.Getattr) and n.attr == "content"))

    def printed(expr) -> int:
        if is_content(expr):
            return 1
        if isinstance(expr, (nodes.Add, nodes.Concat)):
            return sum(printed(child) for child in expr.iter_child_nodes())
        return 0

    tree = env.parse(source)
    total = sum(1 for n in tree.find_all((nodes.Getitem, nodes.Getattr)) if is_content(n))
    return total == sum(printed(expr) for out in tree.find_all(nodes.Output) for expr in out.nodes)


class ShapeRenderer:
    def __init__(self, template, substitutable: bool, variables: dict[str, Any]):
        self._template, self._substitutable, self._variables = template, substitutable, variables
        self._pieces: dict[tuple, list[str] | None] = {}

    def render(self, messages: list[dict], add_generation_prompt: bool, **variables) -> str:
        """variables (tools, enable_thinking...) change the rendering beyond the shape: such a call renders in full."""
        plain = self._plain(messages) and not any(v is not None for v in variables.values())
        pieces = self._shape_pieces(messages, add_generation_prompt) if plain else None
        if pieces is None:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **(self._variables | variables))
        out = [pieces[0]]
        for message, after in zip(messages, pieces[1:]):
            out += [message["content"], after]
        return "".join(out)

    def _plain(self, messages: list[dict]) -> bool:
        # messages of a role and a text content only: another key could change the rendering
        return self._substitutable and all(m.keys() == {"role", "content"} and isinstance(m["content"], str)
                                           for m in messages)

    def _shape_pieces(self, messages: list[dict], add_generation_prompt: bool) -> list[str] | None:
        shape = (tuple(m["role"] for m in messages), add_generation_prompt)
        if shape not in self._pieces:
            if len(self._pieces) >= MAX_SHAPES:
                return None
            self._pieces[shape] = self._split(shape[0], add_generation_prompt)
        return self._pieces[shape]

    def _split(self, roles: tuple[str, ...], add_generation_prompt: bool) -> list[str] | None:
        """The text around each content, from a rendering with unique stand-ins; None unless each shows once,
        in order."""
        marks = [f"\x00{uuid.uuid4().hex}\x00" for _ in roles]
        rest = self._template.render(messages=[{"role": r, "content": m} for r, m in zip(roles, marks)],
                                     add_generation_prompt=add_generation_prompt, **self._variables)
        pieces = []
        for mark in marks:
            before, found, rest = rest.partition(mark)
            if not found or mark in rest:
                return None
            pieces.append(before)
        return [*pieces, rest]
