"""What a plan will cost, before anything runs: for `batchinfer plan` and `submit --dry-run`."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from batchinfer.planner.grouping import Grouping
from batchinfer.planner.prefix_tree import PrefixTree, gc_paused
from batchinfer.planner.types import PendingRequest, PlannerConfig


@dataclass
class PlanEstimate:
    requests: int
    prompt_tokens: int
    max_new_tokens: int  # upper bound: the sum of max_tokens (times n)
    prefix_groups: int
    expected_cached_tokens: int  # every distinct prefix block computed once
    units: int = 0
    workers: int = 0
    estimated_run_s: float | None = None  # None when no throughput figure is known
    rate_source: str = ""  # where the rates behind estimated_run_s came from (measured where, or assumed)

    @property
    def expected_hit_rate(self) -> float:
        return self.expected_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "expected_hit_rate": round(self.expected_hit_rate, 4)}


def estimate_plan(pending: list[PendingRequest], config: PlannerConfig | None = None, *,
                  tokens_per_s: float | None = None, prefill_tokens_per_s: float | None = None,
                  decode_tokens_per_s: float | None = None, decode_s: float | None = None,
                  workers: int = 1, units: int = 0) -> PlanEstimate:
    """Counts plus a run time on `workers` equal workers, each running tokens_per_s over uncached
    prompt tokens plus max_tokens (an upper bound: requests may stop early), or, when given, the
    prefill rate over uncached prompt tokens plus either decode_s (the decode time of the plan's units,
    priced by the caller from measured step costs) or the decode rate over max_tokens."""
    config = config or PlannerConfig()
    with gc_paused():
        tree = PrefixTree(pending, config.block_size)
        groups = len(Grouping(tree, config).groups)
    prompt = sum(len(r.prompt_token_ids) for r in pending)
    cached = min(tree.expected_cached_tokens(), max(prompt - len(pending), 0))
    est = PlanEstimate(
        requests=len(pending), prompt_tokens=prompt, max_new_tokens=sum(r.new_tokens for r in pending),
        prefix_groups=groups, expected_cached_tokens=cached, units=units, workers=workers)
    if workers > 0 and prefill_tokens_per_s and decode_s is not None:
        est.estimated_run_s = ((prompt - cached) / prefill_tokens_per_s + decode_s) / workers
    elif workers > 0 and prefill_tokens_per_s and decode_tokens_per_s:
        seconds = (prompt - cached) / prefill_tokens_per_s + est.max_new_tokens / decode_tokens_per_s
        est.estimated_run_s = seconds / workers
    elif workers > 0 and tokens_per_s:
        est.estimated_run_s = (prompt - cached + est.max_new_tokens) / tokens_per_s / workers
    return est
