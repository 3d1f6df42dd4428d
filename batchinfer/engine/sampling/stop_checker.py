"""When a sequence stops: EOS, a stop string in the decoded text, or max_tokens (finish_reason).

Stop strings are searched in text decoded incrementally (vLLM's detokenizer offsets): each step
decodes only the last few tokens, and holds text back while it ends in a partial UTF-8 character.
"""
from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import replace

from ..scheduler.sequence import Sequence
from .token_bytes import TokenBytes
from ..types import TokenLogprob

REPLACEMENT_CHAR = "\ufffd"  # what a partial UTF-8 character decodes to


def decoded_text(decode: Callable[[list[int]], str], token_ids: list[int], finish_reason: str | None) -> str:
    """A result's text where no stop string cut it: its output ids decoded, special tokens skipped; a max_tokens
    cut inside a multi-byte character drops that character's first bytes."""
    text = decode(token_ids)
    return text.rstrip(REPLACEMENT_CHAR) if finish_reason == "length" else text


class StopChecker:
    def __init__(self, tokenizer, eos_token_ids: AbstractSet[int], max_model_len: int, detokenize: bool = True):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.detokenize = detokenize  # False: final_text leaves the plain decode to the caller (None)
        self.token_bytes = TokenBytes(tokenizer)

    def __call__(self, seq: Sequence) -> str | None:
        p = seq.sampling
        if not p.ignore_eos and seq.token_ids[-1] in self.eos_token_ids:
            return "stop"
        if seq.token_ids[-1] in p.stop_token_ids:
            seq.stop_reason = seq.token_ids[-1]
            return "stop"
        if p.stop and self._hit_stop_string(seq):
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def _hit_stop_string(self, seq: Sequence) -> bool:
        """Extend the decoded text by the new token's characters; cut at the first stop string in them (the one
        that starts first; of two starting together, the first listed), which becomes seq.stop_reason."""
        previous = len(seq.text)
        seq.text += self._decode_delta(seq)
        longest = max(len(s) for s in seq.sampling.stop)
        search_from = max(0, previous - longest + 1)
        found = [(i, s) for s in seq.sampling.stop if (i := seq.text.find(s, search_from)) >= 0]
        if not found:
            return False
        at, seq.stop_reason = min(found, key=lambda hit: hit[0])
        seq.text = seq.text[:at]
        return True

    def _decode_delta(self, seq: Sequence) -> str:
        """The characters the newest tokens complete; empty while they end in a partial character."""
        out = seq.output_token_ids
        before = self.decode(out[seq.prefix_offset:seq.read_offset])
        after = self.decode(out[seq.prefix_offset:])
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(out)
        return after[len(before):]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def with_bytes(self, entry: TokenLogprob) -> TokenLogprob:
        """The entry with the bytes of its token and of each alternative."""
        return replace(entry, token_bytes=self.token_bytes(entry.token_id),
                       top_bytes=tuple(self.token_bytes(t) for t, _ in entry.top))

    def final_text(self, seq: Sequence) -> str | None:
        """The result's text; None where it is the output ids decoded and the caller decodes (detokenize off)."""
        if seq.sampling.stop and seq.finish_reason == "stop" and seq.token_ids[-1] not in self.eos_token_ids:
            return seq.text  # already cut at the stop string
        return decoded_text(self.decode, seq.output_token_ids, seq.finish_reason) if self.detokenize else None
