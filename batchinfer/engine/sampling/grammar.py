"""Grammar-constrained decoding with xgrammar (imported on first use: engines that run no constrained request
never load it). A constraint is (kind, spec): ("json_schema", schema JSON), ("json_object", ""), ("regex", pattern),
("choice", JSON list of strings) or ("tool_calls", schema JSON): a schema whose JSON is written on one line, as
json.dumps writes it (a forced tool call: small models held to a schema that allows any whitespace write newlines
until max_tokens). Grammars are compiled once per distinct constraint per engine; each constrained
request has its own matcher; its token bitmask is filled and applied to its logits row only, and the stop tokens
are allowed only where the grammar can end."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .grammar_budget import over_budget
from .grammar_check import COMPACT_SEPARATORS, choice_ebnf
from .grammar_deadline import compile_error, constraint_key, within_deadline

KINDS = ("json_schema", "json_object", "regex", "choice", "tool_calls")
# compiled grammars (and refusals) an engine keeps, least recently used dropped first: a stream of distinct
# schemas cannot grow its memory without bound (a live matcher keeps its own grammar)
GRAMMARS_KEPT = 256


@dataclass(frozen=True)
class _Refused:
    reason: str


def _compiled_by(compiler: Any, kind: str, spec: str) -> Any:
    if kind == "json_schema":
        return compiler.compile_json_schema(spec)
    if kind == "tool_calls":
        return compiler.compile_json_schema(spec, any_whitespace=False, separators=COMPACT_SEPARATORS)
    if kind == "json_object":
        return compiler.compile_builtin_json_grammar()
    if kind == "regex":
        return compiler.compile_regex(spec)
    return compiler.compile_grammar(choice_ebnf(spec))


class GrammarRunner:
    """The compiled grammars and the live matchers of one engine."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: frozenset[int], token_bytes):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._stop_token_ids, self._token_bytes = stop_token_ids, token_bytes
        self._compiler: Any = None
        # by constraint_key: a schema compiles once, and one refused is refused at once after (a slow compile is
        # not redone)
        self._grammars: OrderedDict[str, Any] = OrderedDict()
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
        """The compiled grammar, once per engine; a constraint over the budget (one that skipped validation) or a
        compile past its deadline raises, which refuses the request alone."""
        key = constraint_key(*constraint)
        found = self._grammars.get(key)
        if found is None:
            try:
                found = self._compile_new(constraint)
            except Exception as exc:
                self._keep(key, _Refused(compile_error(exc)))
                raise
            self._keep(key, found)
        self._grammars.move_to_end(key)
        if isinstance(found, _Refused):
            raise ValueError(found.reason)
        return found

    def _keep(self, key: str, grammar: Any) -> None:
        self._grammars[key] = grammar
        while len(self._grammars) > GRAMMARS_KEPT:
            self._grammars.popitem(last=False)

    def kept(self) -> int:
        return len(self._grammars)

    def _compile_new(self, constraint: tuple[str, str]) -> Any:
        reason = over_budget(*constraint)
        if reason is not None:
            raise ValueError(reason)
        compiler = self._compiler_once()
        return within_deadline(lambda: _compiled_by(compiler, *constraint))

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
