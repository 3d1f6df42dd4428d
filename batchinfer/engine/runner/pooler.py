"""Embed requests: which rows of a step's hidden states each needs, and their pooling across prefill chunks
(the last token's state, or the mean of every prompt token's), L2-normalized when the prompt is done."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..scheduler.sequence import Sequence


@dataclass
class Chunk:
    """One embed request's rows in this step."""

    seq: Sequence
    start: int  # first row in the step
    end: int
    first: bool  # the chunk starts the prompt (a preempted request starts over)
    last: bool  # the chunk ends the prompt


class Pooler:
    def __init__(self, pooling: str):
        self.pooling = pooling
        self.partial: dict[str, tuple[torch.Tensor, int]] = {}  # mean: the sum so far and its token count
        self.done: dict[str, list[float]] = {}

    def chunks(self, seqs: list[Sequence], cu: list[int]) -> list[Chunk]:
        return [Chunk(s, cu[i], cu[i + 1], s.num_computed_tokens == 0, s.samples_this_step())
                for i, s in enumerate(seqs) if s.sampling.embed and s.num_new_tokens]

    def rows(self, chunks: list[Chunk], device: torch.device) -> torch.Tensor:
        """The rows forward_with_hidden returns: every row of a chunk under mean pooling, the last row of a
        prompt's final chunk under last-token pooling."""
        picked: list[int] = []
        for c in chunks:
            if self.pooling == "mean":
                picked += range(c.start, c.end)
            elif c.last:
                picked.append(c.end - 1)
        return torch.tensor(picked, dtype=torch.int64, device=device)

    def fold(self, chunks: list[Chunk], hidden: torch.Tensor) -> None:
        at = 0
        for c in chunks:
            if self.pooling == "mean":
                rows = hidden[at:at + c.end - c.start]
                at += c.end - c.start
                total, count = (rows.sum(0), 0) if c.first else self._add(c.seq.request_id, rows)
                self.partial[c.seq.request_id] = (total, count + len(rows))
                if c.last:
                    total, count = self.partial.pop(c.seq.request_id)
                    self.done[c.seq.request_id] = _normalized(total / count)
            elif c.last:
                self.done[c.seq.request_id] = _normalized(hidden[at])
                at += 1

    def _add(self, request_id: str, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        total, count = self.partial[request_id]
        return total + rows.sum(0), count

    def take(self) -> dict[str, list[float]]:
        done, self.done = self.done, {}
        return done


def _normalized(vector: torch.Tensor) -> list[float]:
    return torch.nn.functional.normalize(vector.double(), dim=0).float().tolist()
