"""The bytes of one token, as logprobs report it (OpenAI's `bytes`): exact for byte-level BPE vocabularies
(GPT-2's byte-to-character map inverted), the token decoded alone otherwise. Looked up lazily, cached."""
from __future__ import annotations

from functools import cached_property


def _byte_decoder() -> dict[str, int]:
    """GPT-2's reversible byte -> printable character map, inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


BYTE_DECODER = _byte_decoder()


class TokenBytes:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, bytes] = {}

    @cached_property
    def _special(self) -> frozenset[int]:  # on the first lookup: the tokenizer may load lazily
        return frozenset(getattr(self.tokenizer, "all_special_ids", ()) or ())

    def __call__(self, token_id: int) -> bytes:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._lookup(token_id)
        return found

    def _lookup(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and piece and all(c in BYTE_DECODER for c in piece) and token_id not in self._special:
            return bytes(BYTE_DECODER[c] for c in piece)
        return self.tokenizer.decode([token_id]).encode("utf-8")
