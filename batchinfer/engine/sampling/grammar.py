"""Grammar-constrained decoding with xgrammar (imported on first use: engines that run no constrained request
never load it). A constraint is (kind, spec): ("json_schema", schema JSON), ("json_object", ""), ("regex", pattern)
or ("choice", JSON list of strings). Grammars are compiled once per distinct constraint per engine; each constrained
request has its own matcher; its token bitmask is filled and applied to its logits row only, and the stop tokens
are allowed only where the grammar can end."""
from __future__ import annotations

import json
from typing import Any

import torch

KINDS = ("json_schema", "json_object", "regex", "choice", "tool_calls")
COMPACT_SEPARATORS = (", ", ": ")  # the "tool_calls" kind's layout, with no whitespace elsewhere


def check_constraint(kind: str, spec: str) -> str | None:
    """Why the grammar library cannot take this constraint (a short reason), or None. No tokenizer needed."""
    import xgrammar as xgr  # lazy: xgrammar, for structured outputs only

    try:
        if kind in ("json_schema", "tool_calls"):
            compact = kind == "tool_calls"
            xgr.Grammar.from_json_schema(spec, any_whitespace=not compact, separators=COMPACT_SEPARATORS if compact else None)
        elif kind == "regex":
            xgr.Grammar.from_regex(spec)
        elif kind == "choice":
            xgr.Grammar.from_ebnf(_choice_ebnf(spec))
    except Exception as exc:  # the library raises RuntimeError/ValueError with its parser's message
        return str(exc).splitlines()[0][:200] if str(exc) else "it cannot be compiled"
    return None


def _choice_ebnf(spec: str) -> str:
    # json.dumps writes each choice as a double-quoted literal with the escapes EBNF strings take
    return "root ::= " + " | ".join(json.dumps(c) for c in json.loads(spec))


class GrammarRunner:
    """The compiled grammars and the live matchers of one engine."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: frozenset[int], token_bytes):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._stop_token_ids, self._token_bytes = stop_token_ids, token_bytes
        self._compiler: Any = None
        self._compiled: dict[tuple[str, str], Any] = {}
        self._matchers: dict[str, Any] = {}

    def add(self, request_id: str, constraint: tuple[str, str] | None) -> None:
        if constraint is None:
            return
        import xgrammar as xgr  # lazy: xgrammar, for structured outputs only

        self._matchers[request_id] = xgr.GrammarMatcher(self._compile(constraint))

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def constrained(self, request_ids: list[str]) -> list[int]:
        return [i for i, rid in enumerate(request_ids) if rid in self._matchers]

    def mask(self, logits: torch.Tensor, request_ids: list[str]) -> torch.Tensor:
        """The logits with every token the grammar forbids at -inf, for the constrained rows only."""
        rows = self.constrained(request_ids)
        if not rows:
            return logits
        import xgrammar as xgr  # lazy: xgrammar, for structured outputs only

        bitmask = xgr.allocate_token_bitmask(len(rows), self._vocab_size)
        for j, i in enumerate(rows):
            self._matchers[request_ids[i]].fill_next_token_bitmask(bitmask, j)
        index = torch.tensor(rows, device=logits.device)
        sub = logits.index_select(0, index)
        xgr.apply_token_bitmask_inplace(sub, bitmask.to(logits.device), vocab_size=min(self._vocab_size, sub.shape[1]))
        return logits.index_copy(0, index, sub)

    def accept(self, request_ids: list[str], tokens: list[int]) -> None:
        for rid, token in zip(request_ids, tokens):
            matcher = self._matchers.get(rid)
            if matcher is not None and not matcher.is_terminated():
                matcher.accept_token(token)

    def _compile(self, constraint: tuple[str, str]) -> Any:
        found = self._compiled.get(constraint)
        if found is None:
            kind, spec = constraint
            compiler = self._compiler_once()
            if kind in ("json_schema", "tool_calls"):
                compact = kind == "tool_calls"
                found = compiler.compile_json_schema(spec, any_whitespace=not compact,
                                                     separators=COMPACT_SEPARATORS if compact else None)
            elif kind == "json_object":
                found = compiler.compile_builtin_json_grammar()
            elif kind == "regex":
                found = compiler.compile_regex(spec)
            else:
                found = compiler.compile_grammar(_choice_ebnf(spec))
            self._compiled[constraint] = found
        return found

    def _compiler_once(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr  # lazy: xgrammar, for structured outputs only

            specials = set(getattr(self._tokenizer, "all_special_ids", ()) or ())
            # Raw bytes per token (exact for byte-level BPE); special tokens as empty: never text in a grammar.
            vocab = [b"" if i in specials else self._token_bytes(i) for i in range(self._vocab_size)]
            info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=self._vocab_size,
                                     stop_token_ids=sorted(self._stop_token_ids))
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler
