"""The runner contract and the sequential-phase accounting shared by one-at-a-time systems."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..flops import ModelShape
from ..metrics import PhaseStats, RequestRecord
from ..workloads import Workload


class SystemUnavailable(RuntimeError):
    """The system cannot run here (an optional package is missing); the bench skips it with this note."""


class Runner(ABC):
    name: str
    shape: ModelShape

    @abstractmethod
    def run(self, workload: Workload) -> tuple[list[RequestRecord], PhaseStats | None]:
        """Serve every prompt greedily to exactly workload.max_tokens tokens (EOS ignored), all arriving now."""

    def close(self) -> None:  # noqa: B027 - an optional hook: most runners hold nothing to release
        pass


def sequential_phases(records: list[RequestRecord], shape: ModelShape, how: str) -> PhaseStats:
    """Prefill is start to first token, decode is first to last token, summed over requests served one by one."""
    ok = [r for r in records if r.error is None]
    return PhaseStats(
        prefill_s=sum(r.first_token_time - r.start_time for r in ok),
        prefill_flops=sum(shape.prefill_flops(r.prompt_tokens, r.cached_tokens) for r in ok),
        decode_s=sum(r.last_token_time - r.first_token_time for r in ok),
        decode_flops=sum(shape.decode_flops(r.prompt_tokens, r.output_tokens) for r in ok),
        how=how)


def failed_record(request_id: str, prompt: list[int], arrival: float, now: float, error: BaseException) -> RequestRecord:
    error_text = f"{type(error).__name__}: {error}"
    return RequestRecord(request_id, len(prompt), 0, arrival, now, now, now, error=error_text)
