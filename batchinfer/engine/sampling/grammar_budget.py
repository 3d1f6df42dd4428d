"""What an output constraint may cost, checked before any grammar is compiled (docs/limits.md says why each bound).

A json_schema, regex or choice list is refused here, naming the bound it passes, when compiling or matching it could
take seconds: xgrammar's compile time grows with the schema's depth (0.07 s at 64 levels, 0.8 s at 150, 28 s at 900).
Pure Python and iterative: a schema of any depth is walked without recursion."""
from __future__ import annotations

import json
import re
from typing import Any

MAX_SPEC_BYTES = 64 * 1024  # a schema, regex or choice list as JSON text
MAX_DEPTH = 64  # levels of JSON nesting in a schema document (32 nested objects, or 64 nested arrays)
MAX_PROPERTIES = 5000  # property names in a whole schema (OpenAI's structured outputs allow 5000)
MAX_ENUM_VALUES = 1000  # values in one enum (OpenAI's bound)
MAX_PATTERN_CHARS = 1000  # one `pattern` or a guided_regex
MAX_REPEAT = 10_000  # minItems, maxLength and kin, and a regex's {n,m}: no output needs more
MAX_CHOICES = 1000  # guided_choice entries

RANGE_KEYWORDS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains",
                  "maxContains")
REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def over_budget(kind: str, spec: str) -> str | None:
    """The bound this constraint passes, as a phrase ("the schema nests 850 levels deep; at most 64"), or None."""
    if len(spec.encode()) > MAX_SPEC_BYTES:
        return f"it is {len(spec.encode())} bytes of JSON; at most {MAX_SPEC_BYTES}"
    if kind == "json_schema":
        return _schema_problem(spec)
    if kind == "regex":
        return _pattern_problem(spec, "the regex")
    if kind == "choice":
        count = len(json.loads(spec))
        return f"it lists {count} choices; at most {MAX_CHOICES}" if count > MAX_CHOICES else None
    return None


def _schema_problem(spec: str) -> str | None:
    try:
        schema = json.loads(spec)
    except RecursionError:  # a line parsed at this depth already; a spec from elsewhere may not have been
        return f"the schema nests more than {MAX_DEPTH} levels deep"
    properties = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"the schema nests more than {MAX_DEPTH} levels deep"
        if isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        problem = _node_problem(node)
        if problem:
            return problem
        if isinstance(node.get("properties"), dict):
            properties += len(node["properties"])
            if properties > MAX_PROPERTIES:
                return f"the schema has more than {MAX_PROPERTIES} properties"
        stack.extend((value, depth + 1) for value in node.values())
    return None


def _node_problem(node: dict) -> str | None:
    """One schema object's own bounds: its enum, its pattern, its count ranges."""
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > MAX_ENUM_VALUES:
        return f"an enum lists {len(enum)} values; at most {MAX_ENUM_VALUES}"
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        problem = _pattern_problem(pattern, "a pattern")
        if problem:
            return problem
    for keyword in RANGE_KEYWORDS:
        value = node.get(keyword)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_REPEAT:
            return f"{keyword} is {value}; at most {MAX_REPEAT}"
    return None


def _pattern_problem(pattern: str, what: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"{what} is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS}"
    for match in REPEAT.finditer(pattern):
        count = max(int(n) for n in match.groups() if n)
        if count > MAX_REPEAT:
            return f"{what} repeats {count} times ({match.group(0)}); at most {MAX_REPEAT}"
    return None
