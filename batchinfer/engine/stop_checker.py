"""When a sequence stops: EOS, a stop string in the decoded text, or max_tokens (finish_reason)."""
from __future__ import annotations

from .sequence import Sequence


class StopChecker:
    def __init__(self, tokenizer, eos_token_ids: set[int], max_model_len: int):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def __call__(self, seq: Sequence) -> str | None:
        p = seq.sampling
        if not p.ignore_eos and seq.token_ids[-1] in self.eos_token_ids:
            return "stop"
        if p.stop and self._hit_stop_string(seq):
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def _hit_stop_string(self, seq: Sequence) -> bool:
        """Decode the completion so far and cut it at the first stop string found in the new text."""
        previous = len(seq.text)
        seq.text = self.decode(seq.output_token_ids)
        longest = max(len(s) for s in seq.sampling.stop)
        search_from = max(0, previous - longest + 1)
        found = [i for i in (seq.text.find(s, search_from) for s in seq.sampling.stop) if i >= 0]
        if not found:
            return False
        seq.text = seq.text[:min(found)]
        return True

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def final_text(self, seq: Sequence) -> str:
        if seq.sampling.stop and seq.finish_reason == "stop" and seq.token_ids[-1] not in self.eos_token_ids:
            return seq.text  # already cut at the stop string
        return self.decode(seq.output_token_ids)
