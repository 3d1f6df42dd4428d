"""Whether an output constraint can be served, checked at validation without a tokenizer (and without torch): the
budget's bounds first, then the grammar library's own parse within its deadline; once per distinct constraint."""
from __future__ import annotations

import json

from .grammar_budget import over_budget
from .grammar_deadline import CHECKS, CompileTooSlow, compile_error, within_deadline

COMPACT_SEPARATORS = (", ", ": ")  # the "tool_calls" kind's layout, with no whitespace elsewhere (grammar.py)


def check_constraint(kind: str, spec: str) -> str | None:
    """Why this constraint cannot be served, as a clause ("it is over a bound of docs/limits.md: ...", "it cannot be
    compiled into a grammar: ..."), or None. No tokenizer needed; checked once per distinct constraint (CHECKS
    counts the hits)."""
    return CHECKS.get_or_check(kind, spec, _check)


def _check(kind: str, spec: str) -> str | None:
    reason = over_budget(kind, spec)
    if reason is not None:
        return f"it is over a bound of docs/limits.md: {reason}"
    import xgrammar as xgr  # lazy: xgrammar, for structured outputs only

    try:
        if kind == "json_schema":
            within_deadline(lambda: xgr.Grammar.from_json_schema(spec))
        elif kind == "tool_calls":
            within_deadline(lambda: xgr.Grammar.from_json_schema(spec, any_whitespace=False, separators=COMPACT_SEPARATORS))
        elif kind == "regex":
            within_deadline(lambda: xgr.Grammar.from_regex(spec))
        elif kind == "choice":
            within_deadline(lambda: xgr.Grammar.from_ebnf(choice_ebnf(spec)))
    except CompileTooSlow as exc:
        return f"it is over a bound of docs/limits.md: {exc}"
    except Exception as exc:  # the library raises RuntimeError/ValueError with its parser's message
        return f"it cannot be compiled into a grammar: {compile_error(exc)}"
    return None


def choice_ebnf(spec: str) -> str:
    # json.dumps writes each choice as a double-quoted literal with the escapes EBNF strings take
    return "root ::= " + " | ".join(json.dumps(c) for c in json.loads(spec))
